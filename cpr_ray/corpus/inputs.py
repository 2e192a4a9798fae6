"""The bulk inputs of a build: S2's and OpenAlex's datasets, each listed once (its shards, a
fingerprint, its empty files), checked before any Ray work, and the OpenAlex snapshot's label."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from cpr_ray.config import Config
from cpr_ray.errors import InputError
from cpr_ray.runs.stage_runner import console
from cpr_ray.storage.store import Storage, join

TEXT_SUFFIXES = (".gz", ".jsonl", ".json")
# the OpenAlex snapshot's list of an entity's parts (data/jsonl/ENTITY/manifest.json), written
# last: not a shard of records
SNAPSHOT_MANIFEST = "manifest.json"


@dataclass(frozen=True)
class InputSet:
    """One bulk dataset: where it lives, its shards (URIs), and whether a build can do without
    it. Zero-byte shards are listed apart in `empty`: nothing to read, but counted."""

    name: str
    uri: str
    required: bool
    files: tuple[str, ...] = ()
    fingerprint: str = ""
    empty: tuple[str, ...] = ()


def _input_sets(cfg: Config) -> list[InputSet]:
    cfg.require("input")  # a config error in one line, not an AttributeError
    assert cfg.input is not None  # require raised otherwise
    s2, oa = cfg.input.s2, cfg.input.openalex
    return [
        InputSet("papers", join(s2, "papers"), True),
        InputSet("abstracts", join(s2, "abstracts"), False),
        InputSet("citations", join(s2, "citations"), True),
        InputSet("publication-venues", join(s2, "publication-venues"), False),
        InputSet("s2orc", join(s2, "s2orc"), False),
        InputSet("works", join(oa, "works"), True),
        InputSet("sources", join(oa, "sources"), False),
    ]


def discover_inputs(cfg: Config, storage: Storage) -> dict[str, InputSet]:
    """List every input shard once; fail early, naming the folder, when a required one is missing
    or holds nothing but empty files. Needs no Ray, so a build checks its inputs in seconds."""
    found: dict[str, InputSet] = {}
    for item in _input_sets(cfg):
        if not storage.exists(item.uri):
            if item.required:
                raise InputError(
                    f"required input {item.name!r} not found at {item.uri} "
                    f"(check input.s2 / input.openalex)"
                )
            console.print(f"  [yellow]note[/]: optional input {item.name!r} absent ({item.uri})")
            found[item.name] = item
            continue
        listed = storage.list_files(item.uri, TEXT_SUFFIXES)
        infos = [i for i in listed if i.base_name != SNAPSHOT_MANIFEST]
        if not infos and item.required:
            raise InputError(
                f"no shards (*{', *'.join(TEXT_SUFFIXES)}) under {item.uri} for required input "
                f"{item.name!r}"
            )
        nonempty = [i for i in infos if i.size]
        if infos and not nonempty and item.required:
            raise InputError(
                f"required input {item.name!r} is empty: its {len(infos)} shard(s) under "
                f"{item.uri} are all zero-byte files"
            )
        digest = hashlib.sha256()
        for info in infos:
            digest.update(f"{info.path}\0{info.size}\0{info.mtime_ns}\n".encode())
        loc = storage.resolve(item.uri)
        found[item.name] = InputSet(
            item.name,
            item.uri,
            item.required,
            tuple(_uri(loc.is_s3, i.path) for i in nonempty),
            digest.hexdigest()[:16],
            tuple(_uri(loc.is_s3, i.path) for i in infos if not i.size),
        )
    return found


def _uri(is_s3: bool, path: str) -> str:
    """A listed file's filesystem path as the URI a message (and the rejects table) shows."""
    return f"s3://{path}" if is_s3 else path


def snapshot_label(cfg: Config, works: InputSet) -> str:
    """Which OpenAlex snapshot the topics came from: config, else the newest partition date."""
    assert cfg.input is not None  # `works` was found from it (discover_inputs)
    if cfg.input.openalex_snapshot:
        return cfg.input.openalex_snapshot
    dates = sorted(
        {m.group(1) for f in works.files for m in [re.search(r"updated_date=([\d-]+)", f)] if m}
    )
    return (
        f"openalex updated_date<={dates[-1]}" if dates else "unknown (set input.openalex_snapshot)"
    )
