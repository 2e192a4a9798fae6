"""Benchmark file formats over :class:`cpr_ray.storage.Storage` (which does the reading), so
s3:// works everywhere."""

from __future__ import annotations

import io
import json
import posixpath

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.json as pajson

from cpr_ray.errors import InputError
from cpr_ray.storage import Storage, join

TABLE_SUFFIXES = (".parquet", ".jsonl", ".jsonl.gz", ".json")


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
    for n, line in enumerate(data.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{uri}: line {n} is not valid JSON ({exc.msg})") from None
        for field in schema:
            value = rec.get(field.name)
            if value is not None and pa.types.is_string(field.type) and not isinstance(value, str):
                value = str(value)
            cols[field.name].append(value)
    return pa.table(cols, schema=schema)


def find_table(storage: Storage, root: str, name: str) -> str | None:
    """`root/name.parquet`, `root/name.jsonl[.gz]` or a folder `root/name/`; None if absent."""
    for suffix in TABLE_SUFFIXES:
        uri = join(root, name + suffix)
        if storage.is_file(uri):
            return uri
    folder = join(root, name)
    loc = storage.resolve(folder)
    if loc.fs.get_file_info(loc.path).type == pafs.FileType.Directory:
        return folder
    return None


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
