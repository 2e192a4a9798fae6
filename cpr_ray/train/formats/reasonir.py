"""ReasonIR HQ and VL: ``query`` ([instruction, text]), ``pos`` and ``neg`` (lists of
[instruction, text]); our own instructions replace theirs. HQ positives are BRIGHT document ids,
filled from ``train.reasonir_documents`` (id, content)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.errors import InputError
from cpr_ray.storage.store import Storage
from cpr_ray.tables.columns import (
    ID,
    PAIRS,
    TEXT,
    TEXT_OR_PAIR,
    Column,
    data_files,
    is_text,
    read_checked,
    where,
)
from cpr_ray.train.formats.common import (
    as_strings,
    has_column,
    last_of_pairs,
    list_array,
    list_parts,
    one_chunk,
    parent_rows,
    text_keys,
    text_lists,
    text_table,
)

COLUMNS = [
    Column("query", TEXT_OR_PAIR),
    Column("pos", PAIRS),
    Column("neg", PAIRS, required=False),
]


def _reasonir_query(table: pa.Table, uri: str) -> pa.Array:
    arr = one_chunk(table.column("query"))
    if is_text(arr.type):
        return as_strings(arr)
    return last_of_pairs(arr, np.arange(len(arr)), uri, "query")


def _reasonir_docs(table: pa.Table, uri: str, column: str) -> pa.Array:
    """A list of [instruction, text] (or of texts) per record -> a list of texts per record."""
    if not has_column(table, column):
        return text_lists(table, column)
    offsets, items = list_parts(table.column(column))
    if is_text(items.type):
        return list_array(offsets, as_strings(items))
    return list_array(offsets, last_of_pairs(items, parent_rows(offsets), uri, column))


def read(table: pa.Table, uri: str) -> pa.Table:
    pos = _reasonir_docs(table, uri, "pos")
    offsets, flat = list_parts(pos)
    if (np.diff(offsets) == 0).any():
        row = int(np.flatnonzero(np.diff(offsets) == 0)[0])
        raise InputError(f"{where(uri, None, row)}: column 'pos' holds no positive")
    positive = flat.take(pa.array(offsets[:-1]))  # the first positive of each record
    query = _reasonir_query(table, uri)
    return text_table(table, uri, query, positive, _reasonir_docs(table, uri, "neg"))


def bright_documents(storage: Storage, uri: str) -> pa.Table:
    columns = [Column("id", ID), Column("content", TEXT)]
    parts = []
    for f in data_files(storage, uri):
        t = read_checked(storage, f, columns)
        parts.append(
            pa.table({"id": as_strings(t.column("id")), "content": as_strings(t.column("content"))})
        )
    return pa.concat_tables(parts)


def fill_hq_positives(raw: pa.Table, documents: pa.Table) -> pa.Table:
    """HQ positives that are BRIGHT document ids -> those documents' text (and their keys)."""
    positive = raw.column("positive")
    at = pc.index_in(positive, value_set=one_chunk(documents.column("id")))
    content = one_chunk(documents.column("content")).take(pc.fill_null(at, 0))
    filled = one_chunk(pc.if_else(pc.is_null(at), positive, content))
    raw = raw.set_column(raw.schema.get_field_index("positive"), "positive", filled)
    index = raw.schema.get_field_index("positive_key")
    return raw.set_column(index, "positive_key", text_keys(filled))
