"""Triplets: ``query``, ``positive``, ``negatives`` (a list, may be empty or absent); optional
``query_id``, ``field``, ``domain``."""

from __future__ import annotations

import pyarrow as pa

from cpr_ray.tables.columns import ID, TEXT, TEXTS, Column
from cpr_ray.train.formats.common import as_strings, text_lists, text_table

COLUMNS = [
    Column("query", TEXT, nonempty=True),
    Column("positive", TEXT, nonempty=True),
    Column("negatives", TEXTS, required=False),
    Column("query_id", ID, required=False),
    Column("field", TEXT, required=False),
    Column("domain", TEXT, required=False),
]


def read(table: pa.Table, uri: str) -> pa.Table:
    query, positive = as_strings(table.column("query")), as_strings(table.column("positive"))
    return text_table(table, uri, query, positive, text_lists(table, "negatives"))
