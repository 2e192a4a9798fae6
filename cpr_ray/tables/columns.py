"""Typed columns of the files users hand us (training data, benchmark tables): each column's
expected kind as Arrow reads it and as a JSON value, checked before any work, so a broken file
is one `InputError` naming the file, the line (JSONL) or row (Parquet) and the column.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from cpr_ray.errors import InputError
from cpr_ray.storage.store import Storage
from cpr_ray.tables.table_files import TABLE_SUFFIXES, json_records


@dataclass(frozen=True)
class Kind:
    """A column's expected type: as Arrow reads it, and as a JSON value (to find the line of a
    file Arrow could not read)."""

    name: str
    arrow: Callable[[pa.DataType], bool]
    json: Callable[[Any], bool]


def is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _is_list_of(inner: Callable[[pa.DataType], bool]) -> Callable[[pa.DataType], bool]:
    """A list type of `inner` items; Arrow types a column whose every list is empty as
    list<null>, which is a list of texts (or ids) with no items."""
    return lambda t: (
        (pa.types.is_list(t) or pa.types.is_large_list(t))
        and (pa.types.is_null(t.value_type) or inner(t.value_type))
    )


def _json_list_of(inner: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and all(x is None or inner(x) for x in v)


def _json_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _json_paper(v: Any) -> bool:
    return isinstance(v, dict) and all(
        v.get(k) is None or isinstance(v.get(k), str) for k in ("title", "abstract")
    )


def _is_paper(t: pa.DataType) -> bool:
    return pa.types.is_struct(t) and all(
        t.get_field_index(k) < 0 or is_text(t.field(k).type) or pa.types.is_null(t.field(k).type)
        for k in ("title", "abstract")
    )


def _is_passages(t: pa.DataType) -> bool:
    """MS MARCO passages: a struct of aligned lists (Hugging Face) or a list of structs."""
    struct = t.value_type if _is_list_of(pa.types.is_struct)(t) else t
    if not pa.types.is_struct(struct):
        return False
    sel, text = struct.get_field_index("is_selected"), struct.get_field_index("passage_text")
    if sel < 0 or text < 0:
        return False
    sel_t, text_t = struct.field(sel).type, struct.field(text).type
    if struct is t:  # struct of lists
        return _is_list_of(pa.types.is_integer)(sel_t) and _is_list_of(is_text)(text_t)
    return pa.types.is_integer(sel_t) and is_text(text_t)


def _json_passages(v: Any) -> bool:
    if isinstance(v, dict):
        return _json_list_of(_json_int)(v.get("is_selected")) and _json_list_of(
            lambda x: isinstance(x, str)
        )(v.get("passage_text"))
    return isinstance(v, list) and all(
        isinstance(p, dict)
        and _json_int(p.get("is_selected"))
        and isinstance(p.get("passage_text"), str)
        for p in v
    )


def _json_str(v: Any) -> bool:
    return isinstance(v, str)


TEXT = Kind("text", is_text, _json_str)
TEXTS = Kind("a list of texts", _is_list_of(is_text), _json_list_of(_json_str))
INT = Kind("an integer", pa.types.is_integer, _json_int)
INTS = Kind("a list of integers", _is_list_of(pa.types.is_integer), _json_list_of(_json_int))
ID = Kind(
    "text or an integer",
    lambda t: is_text(t) or pa.types.is_integer(t),
    lambda v: isinstance(v, str) or _json_int(v),
)
PAPER = Kind("a paper (title, abstract)", _is_paper, _json_paper)
PASSAGES = Kind("MS MARCO passages (is_selected, passage_text)", _is_passages, _json_passages)
# ReasonIR: a query is [instruction, text] (or a text); pos/neg are lists of those
TEXT_OR_PAIR = Kind(
    "text or [instruction, text]",
    lambda t: is_text(t) or _is_list_of(is_text)(t),
    lambda v: isinstance(v, str) or _json_list_of(_json_str)(v),
)
PAIRS = Kind(
    "a list of [instruction, text]",
    lambda t: _is_list_of(_is_list_of(is_text))(t) or _is_list_of(is_text)(t),
    lambda v: (
        isinstance(v, list) and all(isinstance(x, str) or _json_list_of(_json_str)(x) for x in v)
    ),
)


@dataclass(frozen=True)
class Column:
    name: str
    kind: Kind
    required: bool = True  # present and not null in every record
    nonempty: bool = False  # a text that must not be empty (after trimming)
    nullable: bool = False  # present, but a record may leave it null (the caller judges rows)


def line_numbers(data: bytes) -> np.ndarray:
    """1-based line number of each record of a JSONL file (blank lines hold none)."""
    lines = data.decode("utf-8").splitlines()
    return np.array([i for i, line in enumerate(lines, start=1) if line.strip()], np.int64)


def where(uri: str, data: bytes | None, row: int) -> str:
    """`FILE line N` (JSONL) or `FILE row N` (Parquet, 1-based) of a record."""
    if data is None:
        return f"{uri} row {row + 1}"
    return f"{uri} line {int(line_numbers(data)[row])}"


def _locate_json_problem(uri: str, data: bytes, columns: list[Column]) -> InputError:
    """The first line of a JSONL file Arrow could not read, and why."""
    for n, rec in json_records(uri, data):
        for col in columns:
            value = rec.get(col.name)
            if value is not None and not col.kind.json(value):
                return InputError(
                    f"{uri} line {n}: column {col.name!r} holds {type(value).__name__}, "
                    f"expected {col.kind.name}"
                )
    return InputError(f"{uri}: cannot be read as JSON lines")


def check_columns(table: pa.Table, uri: str, data: bytes | None, columns: list[Column]) -> None:
    """Raise on the first column that is missing, of the wrong type, null or empty."""
    for col in columns:
        if col.name not in table.column_names:
            if col.required:
                raise InputError(f"{uri}: missing column {col.name!r} ({col.kind.name})")
            continue
        values = table.column(col.name)
        if pa.types.is_null(values.type):  # null in every record (JSON lines)
            if col.required and not col.nullable and table.num_rows:
                raise InputError(f"{where(uri, data, 0)}: column {col.name!r} is null")
            continue
        if not col.kind.arrow(values.type):
            raise InputError(
                f"{where(uri, data, 0)}: column {col.name!r} holds {values.type}, expected "
                f"{col.kind.name}"
            )
        if col.required and not col.nullable and values.null_count:
            row = int(np.flatnonzero(pc.is_null(values).to_numpy(zero_copy_only=False))[0])
            raise InputError(f"{where(uri, data, row)}: column {col.name!r} is missing or null")
        if col.nonempty:
            empty = pc.equal(pc.utf8_trim_whitespace(values), "").to_numpy(zero_copy_only=False)
            if empty.any():
                row = int(np.flatnonzero(empty)[0])
                raise InputError(f"{where(uri, data, row)}: column {col.name!r} is empty")


def read_checked(storage: Storage, uri: str, columns: list[Column]) -> pa.Table:
    """One Parquet or JSON-lines file, checked against `columns`."""
    data: bytes | None = None
    if uri.endswith(".parquet"):
        table = storage.read_parquet(uri)
    else:
        data = storage.read_bytes(uri)
        try:
            # blocks large enough for any one record (a block boundary inside a line fails)
            options = pajson.ReadOptions(block_size=max(1 << 20, min(len(data), 1 << 28)))
            table = (
                pajson.read_json(pa.BufferReader(data), read_options=options)
                if data.strip()
                else pa.table({})
            )
        except pa.ArrowInvalid:
            raise _locate_json_problem(uri, data, columns) from None
    check_columns(table, uri, data, columns)
    return table


def data_files(storage: Storage, uri: str) -> list[str]:
    """`uri` itself when it is a file, else the table files under the folder."""
    if storage.is_file(uri):
        return [uri]
    storage.check(uri, must_exist=True)
    loc = storage.resolve(uri)
    files = [
        f"{uri.rstrip('/')}/{posixpath.relpath(i.path, loc.path)}"
        for i in storage.list_files(uri, TABLE_SUFFIXES)
    ]
    if not files:
        raise InputError(f"{uri}: no {', '.join(TABLE_SUFFIXES)} files")
    return files
