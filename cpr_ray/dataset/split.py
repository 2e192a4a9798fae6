"""The leak-free split (§3.4): a fixed number of queries per field for CPR-eval, the rest for
CPR-train, and no base paper or positive of an eval query anywhere in train.

Pure functions over Arrow tables, so judge-negatives (which must know each query's split to know
how many negatives to buy) and export (which writes the splits) compute the very same split.

The split is enforced by construction — choose eval, then hold out every train query whose base
or positive is an eval paper, and drop every train negative that is one — and asserted on the
output by `check_no_leakage`, which export calls before publishing.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.tables import duckdb_sql as duck

EVAL, TRAIN, HELD_OUT = "eval", "train", "held_out"
SPLIT = pa.schema(
    [
        ("query_id", pa.string()),
        ("base_id", pa.int64()),
        ("positive_id", pa.int64()),
        ("field", pa.string()),
        ("split", pa.string()),  # eval | train | held_out (a train query that would leak)
    ]
)


class LeakageError(RuntimeError):
    """An eval base paper or positive reached CPR-train: the split code is wrong (a bug, never a
    user's mistake), so it keeps its traceback and nothing is published."""


def _mix(ids: pa.ChunkedArray | pa.Array, seed: int) -> np.ndarray:
    """splitmix64 of (id, seed): a pseudo-random order that is a property of each id, so a
    nightly refresh that adds queries leaves the other queries' draws where they were."""
    x = pc.fill_null(ids, 0).to_numpy(zero_copy_only=False).astype(np.uint64)
    with np.errstate(over="ignore"):
        x = x + np.uint64(seed & 0xFFFFFFFFFFFFFFFF) * np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def assign_split(queries: pa.Table, *, eval_per_field: int, seed: int) -> pa.Table:
    """Each query's split, in input order (`SPLIT` schema).

    Per field, base papers are drawn in a seeded order and their queries taken whole until the
    field has `eval_per_field` (the last base drawn may lend only some of its queries): several
    queries of one base paper then cost train one base paper, not several. A field with fewer
    queries goes to eval entirely. Train keeps what shares no paper with eval's bases and
    positives; the rest is `held_out`.
    """
    q = queries.select(["query_id", "base_id", "positive_id", "field"])
    q = q.append_column("base_key", pa.array(_mix(q["base_id"], seed), pa.uint64()))
    q = q.append_column("pos_key", pa.array(_mix(q["positive_id"], seed), pa.uint64()))
    out = duck.query(
        f"""WITH ranked AS (
                SELECT *, row_number() OVER () AS _row,
                       row_number() OVER (PARTITION BY field
                                          ORDER BY base_key, base_id, pos_key, query_id) AS _r
                FROM q),
            eval_papers AS (
                SELECT base_id AS id FROM ranked WHERE _r <= {int(eval_per_field)}
                UNION SELECT positive_id FROM ranked WHERE _r <= {int(eval_per_field)})
            SELECT query_id, base_id, positive_id, field,
                   CASE WHEN _r <= {int(eval_per_field)} THEN '{EVAL}'
                        WHEN base_id IN (SELECT id FROM eval_papers)
                          OR positive_id IN (SELECT id FROM eval_papers) THEN '{HELD_OUT}'
                        ELSE '{TRAIN}' END AS split
            FROM ranked ORDER BY _row""",
        q=q,
    )
    return out.cast(SPLIT)


def eval_papers(split: pa.Table) -> pa.Array:
    """The ids train must never contain: every base paper and positive of an eval query."""
    ev = split.filter(pc.equal(split["split"], EVAL))
    both = pa.concat_arrays(
        [ev["base_id"].combine_chunks(), ev["positive_id"].combine_chunks()]
    ).cast(pa.int64())
    return pc.unique(both)


def check_no_leakage(cpr_eval: pa.Table, cpr_train: pa.Table) -> None:
    """Raise `LeakageError` unless train is disjoint from eval: no shared query, and no eval
    base paper or positive as a train query's base, positive or negative (export format
    columns: `base_corpus_id`, `positive_id`, train's `negative_ids`)."""
    papers = pc.unique(
        pa.concat_arrays(
            [
                cpr_eval["base_corpus_id"].combine_chunks(),
                cpr_eval["positive_id"].combine_chunks(),
            ]
        )
    )
    problems = []
    shared = pc.is_in(cpr_train["query_id"], value_set=cpr_eval["query_id"].combine_chunks())
    if pc.any(shared).as_py():
        ids = cpr_train["query_id"].filter(shared).to_pylist()
        problems.append(f"{len(ids)} query id(s) in both splits, e.g. {ids[:5]}")
    negatives = pc.list_flatten(cpr_train["negative_ids"])
    for role, column in (
        ("base paper", cpr_train["base_corpus_id"]),
        ("positive", cpr_train["positive_id"]),
        ("negative", negatives),
    ):
        leaked = pc.unique(pc.filter(column, pc.is_in(column, value_set=papers)))
        if len(leaked):
            problems.append(
                f"{len(leaked)} eval paper(s) are a train {role}, e.g. {leaked.to_pylist()[:5]}"
            )
    if problems:
        raise LeakageError("CPR-train leaks CPR-eval: " + "; ".join(problems))
