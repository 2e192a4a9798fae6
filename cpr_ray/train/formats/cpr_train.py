"""A dataset export: ``cpr-train`` (query_id, query, base_corpus_id, positive_id, negative_ids,
field, domain) with texts from ``corpus`` (corpus_id, title, abstract, domain)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.dataset.format import CORPUS_TABLE, TRAIN_TABLE
from cpr_ray.errors import InputError
from cpr_ray.storage.store import Storage
from cpr_ray.tables.columns import INT, INTS, TEXT, Column, data_files, read_checked, where
from cpr_ray.tables.schemas import paper_text
from cpr_ray.tables.table_files import find_table
from cpr_ray.train.examples import RAW
from cpr_ray.train.formats.common import (
    as_strings,
    list_array,
    list_parts,
    one_chunk,
    optional_strings,
    parent_rows,
    read_all,
)

CPR_TRAIN_COLUMNS = [
    Column("query_id", TEXT),
    Column("query", TEXT, nonempty=True),
    Column("positive_id", INT),
    Column("negative_ids", INTS),
    Column("field", TEXT, required=False),
    Column("domain", TEXT, required=False),
]
CORPUS_COLUMNS = [
    Column("corpus_id", INT),
    Column("title", TEXT, required=False),
    Column("abstract", TEXT, required=False),
    Column("domain", TEXT, required=False),
]


@dataclass(frozen=True)
class _Corpus:
    """Paper texts and domains by corpus id (ids sorted)."""

    uri: str
    ids: np.ndarray
    texts: pa.Array
    domains: pa.Array

    @classmethod
    def read(cls, storage: Storage, uri: str) -> _Corpus:
        parts = []
        for f in data_files(storage, uri):
            t = read_checked(storage, f, CORPUS_COLUMNS)
            parts.append(
                pa.table(
                    {
                        "corpus_id": one_chunk(t.column("corpus_id")).cast(pa.int64()),
                        "text": paper_text(
                            optional_strings(t, "title"), optional_strings(t, "abstract")
                        ),
                        "domain": optional_strings(t, "domain"),
                    }
                )
            )
        corpus = pa.concat_tables(parts)
        ids = corpus.column("corpus_id").to_numpy()
        order = pa.array(np.argsort(ids, kind="stable"))
        return cls(
            uri,
            ids[order.to_numpy()],
            one_chunk(corpus.column("text")).take(order),
            one_chunk(corpus.column("domain")).take(order),
        )

    def positions(self, wanted: np.ndarray, rows: np.ndarray, uri: str, column: str) -> pa.Array:
        """Where each wanted id is; the first one missing raises, naming its record."""
        at = np.searchsorted(self.ids, wanted).clip(max=max(len(self.ids) - 1, 0))
        found = self.ids[at] == wanted if len(self.ids) else np.zeros(len(wanted), bool)
        if not found.all():
            i = int(np.flatnonzero(~found)[0])
            raise InputError(
                f"{where(uri, None, int(rows[i]))}: column {column!r}: paper {int(wanted[i])} "
                f"is not in the corpus {self.uri}"
            )
        return pa.array(at, pa.int64())


def _cpr_file(table: pa.Table, uri: str, corpus: _Corpus) -> pa.Table:
    n = table.num_rows
    pos = one_chunk(table.column("positive_id")).cast(pa.int64()).to_numpy()
    offsets, flat = list_parts(table.column("negative_ids"))
    if flat.null_count:
        row = int(parent_rows(offsets)[pc.is_null(flat).to_numpy(zero_copy_only=False)][0])
        raise InputError(f"{where(uri, None, row)}: column 'negative_ids' holds a null id")
    neg = flat.cast(pa.int64()).to_numpy()
    pos_at = corpus.positions(pos, np.arange(n), uri, "positive_id")
    neg_at = corpus.positions(neg, parent_rows(offsets), uri, "negative_ids")
    return pa.table(
        {
            "query_id": as_strings(table.column("query_id")),
            "query": as_strings(table.column("query")),
            "positive": corpus.texts.take(pos_at),
            "negatives": list_array(offsets, corpus.texts.take(neg_at)),
            "positive_key": pa.array(pos, pa.int64()),
            "negative_keys": list_array(offsets, pa.array(neg, pa.int64())),
            "field": optional_strings(table, "field"),
            "domain": optional_strings(table, "domain"),
            "positive_domain": corpus.domains.take(pos_at),
        },
        schema=RAW,
    )


def read_cpr(storage: Storage, root: str) -> pa.Table:
    train_uri = find_table(storage, root, TRAIN_TABLE)
    corpus_uri = find_table(storage, root, CORPUS_TABLE)
    if train_uri is None or corpus_uri is None:
        missing = [t for t, u in ((TRAIN_TABLE, train_uri), (CORPUS_TABLE, corpus_uri)) if not u]
        raise InputError(
            f"{root} is not a CPR export: no {' or '.join(missing)} table "
            "(expected NAME.parquet or a NAME/ folder of Parquet files)"
        )
    corpus = _Corpus.read(storage, corpus_uri)
    return read_all(storage, train_uri, CPR_TRAIN_COLUMNS, lambda t, uri: _cpr_file(t, uri, corpus))
