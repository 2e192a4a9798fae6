"""What every training format's reader builds on: text keys and list columns over Arrow, the RAW
table a reader returns, and reading every file of a folder."""

from __future__ import annotations

import posixpath
from collections.abc import Callable

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.errors import InputError
from cpr_ray.storage.store import Storage
from cpr_ray.tables.columns import Column, data_files, read_checked, where
from cpr_ray.tables.schemas import one_chunk
from cpr_ray.train.examples import RAW


def text_keys(texts: pa.Array | pa.ChunkedArray) -> pa.Array:
    """int64 key per text: equal texts, equal keys (polars' vectorised 64-bit hash)."""
    series = pl.from_arrow(one_chunk(texts).cast(pa.string()))
    assert isinstance(series, pl.Series)  # from an Arrow array, not a table
    return pa.array(series.hash(seed=0).to_numpy().view(np.int64), pa.int64())


def as_strings(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return one_chunk(values).cast(pa.string())


def list_parts(values: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, pa.Array]:
    """(offsets, values) of a list column, a null list as an empty one.

    Rebuilt from the lengths, since a sliced Arrow list array keeps offsets into values it no
    longer holds.
    """
    arr = one_chunk(values)
    lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False)
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), pc.list_flatten(arr)


def list_array(offsets: np.ndarray, values: pa.Array) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)


def parent_rows(offsets: np.ndarray) -> np.ndarray:
    """The row of each flat value."""
    return np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))


def has_column(table: pa.Table, column: str) -> bool:
    return column in table.column_names and not pa.types.is_null(table.schema.field(column).type)


def optional_strings(table: pa.Table, column: str) -> pa.Array:
    if has_column(table, column):
        return as_strings(table.column(column))
    return pa.nulls(table.num_rows, pa.string())


def text_lists(table: pa.Table, column: str) -> pa.Array:
    """A list-of-texts column as list<string>; absent or null: empty lists."""
    if not has_column(table, column):
        return list_array(np.zeros(table.num_rows + 1, np.int64), pa.array([], pa.string()))
    offsets, flat = list_parts(table.column(column))
    return list_array(offsets, as_strings(flat))


def text_table(
    table: pa.Table, uri: str, query: pa.Array, positive: pa.Array, negatives: pa.Array
) -> pa.Table:
    """RAW from texts; query ids, field and domain from the file's own columns where it has
    them (an id defaults to `FILE:N`, N the record's 1-based position)."""
    n = len(query)
    name = posixpath.basename(uri)
    qid = optional_strings(table, "query_id")
    default_ids = pa.array([f"{name}:{i + 1}" for i in range(n)], pa.string())
    offsets, flat = list_parts(negatives)
    return pa.table(
        {
            "query_id": pc.if_else(pc.is_null(qid), default_ids, qid),
            "query": query,
            "positive": positive,
            "negatives": list_array(offsets, flat),
            "positive_key": text_keys(positive),
            "negative_keys": list_array(offsets, text_keys(flat)),
            "field": optional_strings(table, "field"),
            "domain": optional_strings(table, "domain"),
            "positive_domain": pa.nulls(n, pa.string()),
        },
        schema=RAW,
    )


def last_of_pairs(values: pa.Array, rows: np.ndarray, uri: str, column: str) -> pa.Array:
    """The last element of each list (ReasonIR's [instruction, text] -> text); `rows` is the
    record each list belongs to, for the error."""
    offsets, flat = list_parts(values)
    lengths = np.diff(offsets)
    if (lengths == 0).any():
        row = int(rows[np.flatnonzero(lengths == 0)[0]])
        raise InputError(f"{where(uri, None, row)}: column {column!r} holds an empty pair")
    return as_strings(flat.take(pa.array(offsets[1:] - 1)))


def read_all(
    storage: Storage, uri: str, columns: list[Column], convert: Callable[[pa.Table, str], pa.Table]
) -> pa.Table:
    """Every file under `uri`, each checked and converted to RAW on its own (errors name it)."""
    parts = [convert(read_checked(storage, f, columns), f) for f in data_files(storage, uri)]
    return pa.concat_tables(parts) if parts else RAW.empty_table()
