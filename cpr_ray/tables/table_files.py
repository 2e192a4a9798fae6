"""Table files of benchmarks, corpora and training data: found by name under a folder, in any of
the forms they come in (Parquet, JSON lines, gzipped or not), and JSON lines read to a schema."""

from __future__ import annotations

import io
import json
import posixpath
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.json as pajson

from cpr_ray.errors import InputError
from cpr_ray.storage.store import Storage, join

TABLE_SUFFIXES = (".parquet", ".jsonl", ".jsonl.gz", ".json")


def json_records(uri: str, data: bytes) -> Iterator[tuple[int, dict[str, Any]]]:
    """Each record of a JSON lines file with its 1-based line number (blank lines hold none).
    The one line-by-line reader, so every JSON lines input names a bad line the same way:
    `URI line N: ...`."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{uri}: not UTF-8 text (byte {exc.start}): not a JSON lines file"
        ) from None
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{uri} line {n}: not valid JSON ({exc.msg})") from None
        if not isinstance(rec, dict):
            raise InputError(f"{uri} line {n}: not a JSON object")
        yield n, rec


def read_jsonl(storage: Storage, uri: str, schema: pa.Schema) -> pa.Table:
    """JSON lines with the given columns (others ignored; numbers in string columns become text).

    Arrow's reader is tried first; files whose ids are sometimes numbers fall back to a
    line-by-line parse that converts them.
    """
    data = storage.read_bytes(uri)
    try:
        return pajson.read_json(
            io.BytesIO(data),
            parse_options=pajson.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior="ignore"
            ),
        )
    except pa.ArrowInvalid:
        pass
    cols: dict[str, list] = {name: [] for name in schema.names}
    for n, rec in json_records(uri, data):
        for field in schema:
            value = rec.get(field.name)
            if value is not None and pa.types.is_string(field.type) and not isinstance(value, str):
                if not isinstance(value, (int, float)):  # an id given as a number is text
                    raise InputError(
                        f"{uri} line {n}: {field.name} is a JSON {type(value).__name__}, not text"
                    )
                value = str(value)
            cols[field.name].append(value)
    try:
        return pa.table(cols, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        fields = ", ".join(f"{f.name} ({f.type})" for f in schema)
        raise InputError(f"{uri}: a value has the wrong type; expected {fields} ({exc})") from None


def find_table(storage: Storage, root: str, name: str) -> str | None:
    """`root/name.parquet`, `root/name.jsonl[.gz]` or a folder `root/name/`; None if absent."""
    for suffix in TABLE_SUFFIXES:
        uri = join(root, name + suffix)
        if storage.is_file(uri):
            return uri
    folder = join(root, name)
    return folder if storage.is_dir(folder) else None


def files_under(storage: Storage, uri: str, prefix: str) -> list[str]:
    """Table files under `uri` whose path below it starts with `prefix` (a name or folder)."""
    loc = storage.resolve(uri)
    out = []
    for info in storage.list_files(uri, TABLE_SUFFIXES):
        rel = posixpath.relpath(info.path, loc.path)
        if (
            rel.startswith(prefix + "/")
            or rel.startswith(prefix + "-")
            or rel.startswith(prefix + ".")
        ):
            out.append(join(uri, rel))
    return out
