"""Reading benchmark files through :class:`cpr_ray.storage.Storage`, so s3:// works everywhere."""

from __future__ import annotations

import gzip
import io
import json
import posixpath

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.json as pajson
import pyarrow.parquet as pq

from cpr_ray.storage import Storage, StorageError, join

TABLE_SUFFIXES = (".parquet", ".jsonl", ".jsonl.gz", ".json")


def read_bytes(storage: Storage, uri: str) -> bytes:
    loc = storage.check(uri, must_exist=True)
    try:
        with loc.fs.open_input_stream(loc.path) as f:
            data = f.read()
    except OSError as exc:
        raise StorageError(f"cannot read {loc.uri}: {exc}") from None
    return gzip.decompress(data) if uri.endswith(".gz") else data


def read_text(storage: Storage, uri: str) -> str:
    return read_bytes(storage, uri).decode("utf-8")


def is_file(storage: Storage, uri: str) -> bool:
    loc = storage.resolve(uri)
    return loc.fs.get_file_info(loc.path).type == pafs.FileType.File


def read_parquet(storage: Storage, uri: str, columns: list[str] | None = None) -> pa.Table:
    """A Parquet file or a folder of Parquet files."""
    loc = storage.check(uri, must_exist=True)
    try:
        return pq.read_table(loc.path, filesystem=loc.fs, columns=columns)
    except (OSError, pa.ArrowInvalid) as exc:
        raise StorageError(f"cannot read Parquet at {loc.uri}: {exc}") from None


def read_jsonl(storage: Storage, uri: str, schema: pa.Schema) -> pa.Table:
    """JSON lines with the given columns (others ignored; numbers in string columns become text).

    Arrow's reader is tried first; files whose ids are sometimes numbers fall back to a
    line-by-line parse that converts them.
    """
    data = read_bytes(storage, uri)
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
            raise ValueError(f"{uri}: line {n} is not valid JSON ({exc.msg})") from None
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
        if is_file(storage, uri):
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
