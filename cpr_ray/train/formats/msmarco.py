"""MS MARCO v1.1 train: ``query``, ``query_id``, ``passages`` as Hugging Face gives it (a struct
of lists) or as the original JSON does (a list of structs). Queries with exactly one selected
passage and at least nine unselected ones; the first nine unselected are the negatives."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.errors import InputError
from cpr_ray.tables.columns import ID, PASSAGES, TEXT, Column, where
from cpr_ray.train.formats.common import (
    as_strings,
    list_array,
    list_parts,
    one_chunk,
    parent_rows,
    text_table,
)

MSMARCO_NEGATIVES = 9  # first unselected passages kept; a query needs at least this many

COLUMNS = [
    Column("query", TEXT),
    Column("passages", PASSAGES),
    Column("query_id", ID, required=False),
]


def read(table: pa.Table, uri: str) -> pa.Table:
    passages = one_chunk(table.column("passages"))
    n = table.num_rows
    if pa.types.is_struct(passages.type):  # Hugging Face: a struct of aligned lists
        offsets, sel = list_parts(passages.field("is_selected"))
        text_offsets, texts = list_parts(passages.field("passage_text"))
        if not np.array_equal(offsets, text_offsets):
            row = int(np.flatnonzero(np.diff(offsets) != np.diff(text_offsets))[0])
            raise InputError(
                f"{where(uri, None, row)}: column 'passages': is_selected and passage_text "
                "differ in length"
            )
    else:  # the original JSON: a list of passage objects
        offsets, flat = list_parts(passages)
        sel, texts = flat.field("is_selected"), flat.field("passage_text")
    parents = parent_rows(offsets)
    selected = pc.fill_null(pc.equal(sel, 1), False).to_numpy(zero_copy_only=False)
    n_sel = np.bincount(parents[selected], minlength=n)
    unsel = np.flatnonzero(~selected)  # flat positions, in row order then passage order
    unsel_rows = parents[unsel]
    rank = np.arange(len(unsel)) - np.searchsorted(unsel_rows, unsel_rows)  # among the row's
    keep = (n_sel == 1) & (np.bincount(unsel_rows, minlength=n) >= MSMARCO_NEGATIVES)
    rows = np.flatnonzero(keep)
    positive_at = np.flatnonzero(selected)[keep[parents[selected]]]  # one per kept row
    negative_at = unsel[(rank < MSMARCO_NEGATIVES) & keep[unsel_rows]]  # nine per kept row
    kept = table.take(pa.array(rows, pa.int64()))
    negatives = list_array(
        np.arange(len(rows) + 1) * MSMARCO_NEGATIVES,
        as_strings(texts.take(pa.array(negative_at, pa.int64()))),
    )
    positive = as_strings(texts.take(pa.array(positive_at, pa.int64())))
    out = text_table(kept, uri, as_strings(kept.column("query")), positive, negatives)
    return out.replace_schema_metadata({"dropped_msmarco_selection": str(n - len(rows))})
