"""CPR-eval from a dataset export (`../shared/DESIGN.md`, "Dataset export format").

EXPORT/ holds ``cpr-eval`` and ``corpus`` (each a Parquet file ``NAME.parquet`` or a folder
``NAME/`` of Parquet files) and optionally ``cpr-train`` (few-shot pairs for Query2doc). Each
query ranks its own candidates (the positive and its hard negatives, 151 in the full set); the
single positive has grade 1. A document's text is its title and abstract on two lines.

Records that break the contract are not evaluated; each is reported with its reason in
``Benchmark.rejects``: candidate ids and groups of different lengths, a positive missing from its
candidates or present twice, a positive not labelled ``positive``, an unknown group label, a
candidate missing from the corpus, an empty query.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.evaluate.benchmark import Benchmark, require_unique
from cpr_ray.retrieval.base import PAD, document_texts
from cpr_ray.storage.store import Storage, StorageError
from cpr_ray.tables.columns import ID, INT, INTS, TEXT, TEXTS, Column, check_columns
from cpr_ray.tables.table_files import find_table

GROUPS = ("positive", "shares_query_topic", "shares_positive_topic", "other")
# present and typed; a record with a null or inconsistent value is rejected with its reason below
EVAL_COLUMNS = [
    Column("query_id", ID),
    Column("query", TEXT, nullable=True),
    Column("base_corpus_id", INT, nullable=True),
    Column("positive_id", INT, nullable=True),
    Column("candidate_ids", INTS, nullable=True),
    Column("candidate_groups", TEXTS, nullable=True),
    Column("field", TEXT, nullable=True),
    Column("domain", TEXT, nullable=True),
]


def doc_texts(corpus: pa.Table) -> tuple[np.ndarray, list[str]]:
    """(corpus ids sorted, texts aligned): title and abstract (where it may be shown)."""
    ids = corpus.column("corpus_id").to_numpy().astype(np.int64)
    texts = document_texts(corpus.column("title"), corpus.column("abstract"))
    order = np.argsort(ids, kind="stable")
    return ids[order], [texts[i] for i in order]


def load_cpr(
    storage: Storage,
    root: str,
    *,
    split: str = "cpr-eval",
    max_train_pairs: int = 1000,
    full: bool = False,
) -> Benchmark:
    """CPR-eval as the paper evaluates it (each query ranks its own candidates), or with `full`
    over the whole exported corpus (`cpr-full`: the positive among every paper, the query's own
    base paper never returned), the setting the paper names as its limitation."""
    eval_uri = find_table(storage, root, split)
    corpus_uri = find_table(storage, root, "corpus")
    if eval_uri is None or corpus_uri is None:
        missing = [n for n, u in ((split, eval_uri), ("corpus", corpus_uri)) if u is None]
        raise StorageError(
            f"{root} is not a CPR export: no {' or '.join(missing)} table "
            "(expected NAME.parquet or a NAME/ folder of Parquet files)"
        )
    table = storage.read_parquet(eval_uri)
    check_columns(table, eval_uri, None, EVAL_COLUMNS)
    corpus = storage.read_parquet(corpus_uri, ["corpus_id", "title", "abstract"])
    corpus_ids, corpus_texts = doc_texts(corpus)
    if len(np.unique(corpus_ids)) != len(corpus_ids):
        require_unique([str(i) for i in corpus_ids], corpus_uri)

    n = table.num_rows
    cand = table.column("candidate_ids").combine_chunks()
    groups = table.column("candidate_groups").combine_chunks()
    n_cand = pc.fill_null(pc.list_value_length(cand), 0).to_numpy(zero_copy_only=False)
    n_grp = pc.fill_null(pc.list_value_length(groups), 0).to_numpy(zero_copy_only=False)
    positive = pc.fill_null(table.column("positive_id"), -1).to_numpy().astype(np.int64)
    flat_ids = pc.fill_null(cand.flatten(), -1).to_numpy().astype(np.int64)
    row_of = np.repeat(np.arange(n), n_cand)  # query row of each flat candidate

    reasons: list[str | None] = [None] * n

    def flag(mask: np.ndarray, reason: str) -> None:
        for i in np.flatnonzero(mask):
            reasons[i] = reasons[i] or reason

    queries = pc.fill_null(table.column("query"), "").to_pylist()
    flag(np.array([not q.strip() for q in queries], dtype=bool), "empty query")
    flag(n_cand != n_grp, "candidate_ids and candidate_groups differ in length")
    flag(n_cand == 0, "no candidates")
    is_pos = flat_ids == positive[row_of]
    pos_count = np.bincount(row_of[is_pos], minlength=n)
    flag(pos_count == 0, "positive_id is not among candidate_ids")
    flag(pos_count > 1, "positive_id appears more than once among candidate_ids")
    # a negative listed twice is ranked once (as MTEB, whose candidate lists are id -> score
    # maps, ranks it): its first listing is kept, and the repeats are counted below
    first = np.zeros(len(flat_ids), dtype=bool)
    first[np.unique(np.stack([row_of, flat_ids], axis=1), axis=0, return_index=True)[1]] = True
    found = np.searchsorted(corpus_ids, flat_ids).clip(max=max(len(corpus_ids) - 1, 0))
    in_corpus = corpus_ids[found] == flat_ids if len(corpus_ids) else np.zeros_like(flat_ids, bool)
    flag(np.bincount(row_of[~in_corpus], minlength=n) > 0, "candidate missing from the corpus")
    all_groups = np.array(pc.fill_null(groups.flatten(), "").to_pylist(), dtype=object)
    known = np.isin(all_groups, GROUPS)
    flag(
        np.bincount(np.repeat(np.arange(n), n_grp)[~known], minlength=n) > 0,
        "unknown candidate group label",
    )
    # each candidate's group, where its query's two lists are aligned (the others are rejected)
    starts = np.concatenate([[0], np.cumsum(n_cand)[:-1]]).astype(np.int64)
    group_starts = np.concatenate([[0], np.cumsum(n_grp)[:-1]]).astype(np.int64)
    aligned = (n_cand == n_grp)[row_of]
    at = group_starts[row_of] + np.arange(len(flat_ids)) - starts[row_of]
    flat_groups = np.where(
        aligned, all_groups[np.where(aligned, at, 0)] if len(all_groups) else "", ""
    )
    bad_pos_label = is_pos & aligned & (flat_groups != "positive")
    flag(np.bincount(row_of[bad_pos_label], minlength=n) > 0, "positive not labelled positive")

    keep = np.array([r is None for r in reasons])
    query_ids = [str(q) for q in table.column("query_id").to_pylist()]
    rejects = [{"query_id": q, "reason": r} for q, r in zip(query_ids, reasons) if r is not None]
    repeats = np.bincount(row_of[~first], minlength=n)[keep]
    if repeats.any():
        rejects.append(
            {
                "query_id": "*",
                "reason": f"{int(repeats.sum())} repeated candidate(s) in the candidate_ids of "
                f"{int((repeats > 0).sum())} queries dropped (each candidate is ranked once)",
            }
        )
    n_cand = np.bincount(row_of[first], minlength=n)  # distinct candidates per query

    # document table: the union of the kept pools, in corpus-id order
    kept_flat = keep[row_of]
    used = np.unique(flat_ids[kept_flat])
    used_pos = np.searchsorted(corpus_ids, used)
    doc_ids = [str(i) for i in used]
    texts = [corpus_texts[i] for i in used_pos]

    rows = np.flatnonzero(keep)
    width = int(n_cand[rows].max()) if len(rows) else 0
    pools = np.full((len(rows), width), PAD, dtype=np.int64)
    pool_groups = np.full((len(rows), width), "", dtype=object)
    distinct_ids, distinct_groups = flat_ids[first], flat_groups[first]  # still in pool order
    starts = np.concatenate([[0], np.cumsum(n_cand)[:-1]])
    for out_row, i in enumerate(rows):  # one slice per query, not per candidate
        sl = slice(starts[i], starts[i] + n_cand[i])
        pools[out_row, : n_cand[i]] = np.searchsorted(used, distinct_ids[sl])
        pool_groups[out_row, : n_cand[i]] = distinct_groups[sl]
    pos_doc = np.searchsorted(used, positive[rows])
    col = {c: table.column(c).to_pylist() for c in ("field", "domain", "base_corpus_id")}

    train_pairs = _train_pairs(storage, root, corpus_ids, corpus_texts, max_train_pairs)
    if full:
        base = np.array(col["base_corpus_id"], dtype=np.int64)[rows]
        at = np.searchsorted(corpus_ids, base).clip(max=max(len(corpus_ids) - 1, 0))
        own = [np.array([a] if corpus_ids[a] == b else [], np.int64) for a, b in zip(at, base)]
        return Benchmark(
            name="cpr-full",
            query_ids=[query_ids[i] for i in rows],
            queries=[queries[i] for i in rows],
            doc_ids=[str(i) for i in corpus_ids],
            doc_texts=corpus_texts,
            qrels=[{int(p): 1} for p in np.searchsorted(corpus_ids, positive[rows])],
            excluded=own,
            domains=[col["domain"][i] for i in rows],
            meta={"field": [col["field"][i] for i in rows]},
            train_pairs=train_pairs,
            rejects=rejects,
        )
    return Benchmark(
        name="cpr",
        query_ids=[query_ids[i] for i in rows],
        queries=[queries[i] for i in rows],
        doc_ids=doc_ids,
        doc_texts=texts,
        qrels=[{int(p): 1} for p in pos_doc],
        pools=pools,
        pool_groups=pool_groups,
        domains=[col["domain"][i] for i in rows],
        meta={"field": [col["field"][i] for i in rows]},
        train_pairs=train_pairs,
        rejects=rejects,
    )


def _train_pairs(
    storage: Storage, root: str, corpus_ids: np.ndarray, texts: list[str], limit: int
) -> list[tuple[str, str]]:
    uri = find_table(storage, root, "cpr-train")
    if uri is None or limit <= 0:
        return []
    train = storage.read_parquet(uri, ["query", "positive_id"]).slice(0, limit)
    pos = train.column("positive_id").to_numpy().astype(np.int64)
    at = np.searchsorted(corpus_ids, pos).clip(max=max(len(corpus_ids) - 1, 0))
    ok = corpus_ids[at] == pos if len(corpus_ids) else np.zeros(len(pos), bool)
    queries = train.column("query").to_pylist()
    return [(queries[i], texts[at[i]]) for i in np.flatnonzero(ok)]
