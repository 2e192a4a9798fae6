"""`cpr to-beir`: an export as BEIR files, for the toolkits that read BEIR (Pyserini, BEIR, MTEB's
BEIR loaders) to evaluate on CPR over the whole corpus (`cpr-full`).

BEIR has one way to keep a document out of a query's ranking: a document whose id is the
query's id is never returned. CPR-full keeps each query's own base paper out (the paper the query
was written from, which would otherwise rank first), and several queries share a base paper
(CPR-eval: 1,300 queries from 1,080 base papers), so ids cannot carry it. The base paper is
written where BEIR leaves room for data of one's own, the query's ``metadata``:
``excluded_ids``. `cpr eval --benchmark beir` honours it, so on these files it equals
`--benchmark cpr-full` on the export; a toolkit that ignores ``metadata`` also ranks the base
paper (and scores lower by about the share of queries whose base paper outranks the positive).

The queries are the export's CPR-eval records that the CPR loader accepts (a record it rejects
is left out and counted, as `cpr eval` does) and all of CPR-train's; ``qrels/test.tsv`` holds
each eval query's positive and ``qrels/train.tsv`` each train query's. Documents are the whole
corpus in corpus-id order, text the abstract ("" where the licence withholds it: `cpr hydrate`
first to fill it). Each file is written atomically: a failed run leaves none half-written.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.dataset.format import CORPUS_TABLE, TRAIN_TABLE
from cpr_ray.evaluate.loaders.cpr_eval import load_cpr
from cpr_ray.storage.store import Storage, join
from cpr_ray.tables.columns import ID, INT, TEXT, Column, check_columns
from cpr_ray.tables.table_files import find_table

CORPUS_FILE, QUERIES_FILE = "corpus.jsonl", "queries.jsonl"
QRELS_HEADER = "query-id\tcorpus-id\tscore\n"
TEST, TRAIN = "test", "train"
TRAIN_COLUMNS = [
    Column("query_id", ID),
    Column("query", TEXT),
    Column("base_corpus_id", INT, nullable=True),
    Column("positive_id", INT),
    Column("field", TEXT, nullable=True),
    Column("domain", TEXT, nullable=True),
]


def _lines(rows: Iterable[dict[str, Any]]) -> Iterator[bytes]:
    for row in rows:
        yield (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")


def _write(storage: Storage, uri: str, chunks: Iterable[bytes]) -> None:
    with storage.atomic_output(uri) as out:
        for chunk in chunks:
            out.write(chunk)


def _corpus_rows(corpus: pa.Table) -> Iterator[dict[str, Any]]:
    corpus = corpus.sort_by("corpus_id")  # the order `cpr-full` ranks in: ties break alike
    for batch in corpus.to_batches(max_chunksize=10_000):
        for r in batch.to_pylist():
            yield {
                "_id": str(r["corpus_id"]),
                "title": r["title"] or "",
                "text": r["abstract"] or "",
                "metadata": {
                    "year": r["year"],
                    "field": r["field"],
                    "domain": r["domain"],
                    "abstract_withheld": r["abstract"] is None,
                },
            }


def _query(
    query_id: str, text: str, split: str, base: int | None, field: str | None, domain: str | None
) -> dict[str, Any]:
    return {
        "_id": query_id,
        "text": text,
        "metadata": {
            "split": split,
            "base_corpus_id": None if base is None else str(base),
            "field": field,
            "domain": domain,
            "excluded_ids": [] if base is None else [str(base)],
        },
    }


def write_beir(storage: Storage, export: str, out: str) -> dict[str, Any]:
    """Write `export` as BEIR files under `out`; return the counts and the rejected records."""
    bench = load_cpr(storage, export, full=True, max_train_pairs=0)  # validated, as `cpr eval`
    corpus_uri = find_table(storage, export, CORPUS_TABLE)
    assert corpus_uri is not None  # load_cpr found it
    corpus = storage.read_parquet(
        corpus_uri, ["corpus_id", "title", "abstract", "year", "field", "domain"]
    )
    known = corpus.column("corpus_id").combine_chunks()
    assert bench.domains is not None  # load_cpr gives each query its domain
    eval_rows = [
        _query(
            qid,
            text,
            TEST,
            int(bench.doc_ids[excluded[0]]) if len(excluded) else None,
            bench.meta["field"][i],
            bench.domains[i],
        )
        for i, (qid, text, excluded) in enumerate(
            zip(bench.query_ids, bench.queries, bench.excluded or [])
        )
    ]
    test_qrels = [
        (qid, bench.doc_ids[doc]) for qid, rel in zip(bench.query_ids, bench.qrels) for doc in rel
    ]
    train_rows: list[dict[str, Any]] = []
    train_qrels: list[tuple[str, str]] = []
    train_uri = find_table(storage, export, TRAIN_TABLE)
    if train_uri is not None:
        train = storage.read_parquet(train_uri)
        check_columns(train, train_uri, None, TRAIN_COLUMNS)
        train = train.filter(pc.is_in(train["positive_id"], value_set=known))
        for r in train.to_pylist():
            train_rows.append(
                _query(
                    r["query_id"], r["query"], TRAIN, r["base_corpus_id"], r["field"], r["domain"]
                )
            )
            train_qrels.append((r["query_id"], str(r["positive_id"])))

    _write(storage, join(out, CORPUS_FILE), _lines(_corpus_rows(corpus)))
    _write(storage, join(out, QUERIES_FILE), _lines([*eval_rows, *train_rows]))
    for split, pairs in ((TEST, test_qrels), (TRAIN, train_qrels)):
        if pairs or split == TEST:
            body = "".join(f"{q}\t{d}\t1\n" for q, d in pairs)
            _write(storage, join(out, "qrels", f"{split}.tsv"), [(QRELS_HEADER + body).encode()])
    return {
        "out": out,
        "documents": corpus.num_rows,
        "test_queries": len(eval_rows),
        "train_queries": len(train_rows),
        "rejects": bench.rejects,
    }
