"""SciRepEval ``cite_prediction``: ``query``, ``pos``, ``neg`` papers (title, abstract); every
paper becomes the one paper text."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from cpr_ray.tables.columns import PAPER, Column
from cpr_ray.tables.schemas import paper_text
from cpr_ray.train.formats.common import as_strings, list_array, one_chunk, text_table

COLUMNS = [
    Column("query", PAPER),
    Column("pos", PAPER),
    Column("neg", PAPER),
]


def _paper_column(table: pa.Table, column: str) -> pa.Array:
    papers = one_chunk(table.column(column))
    n = len(papers)
    parts = [
        as_strings(papers.field(k))
        if papers.type.get_field_index(k) >= 0
        else pa.nulls(n, pa.string())
        for k in ("title", "abstract")
    ]
    return paper_text(*parts)


def read(table: pa.Table, uri: str) -> pa.Table:
    neg = _paper_column(table, "neg")
    negatives = list_array(np.arange(len(neg) + 1), neg)
    query, positive = _paper_column(table, "query"), _paper_column(table, "pos")
    return text_table(table, uri, query, positive, negatives)
