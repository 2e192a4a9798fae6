"""The leak-free split (§3.4), pure: eval per field, train disjoint from eval, checked."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpr_ray.dataset.export import split_tables
from cpr_ray.dataset.split import (
    EVAL,
    HELD_OUT,
    TRAIN,
    LeakageError,
    assign_split,
    check_no_leakage,
    eval_papers,
)

GROUPS = ("shares_query_topic", "shares_positive_topic", "other")


def queries_table(rows: list[tuple[int, int, str]]) -> pa.Table:
    """Pool's queries for (base, positive, field) triples (only what the split reads)."""
    return pa.table(
        {
            "query_id": [f"{b}-{p}" for b, p, _ in rows],
            "query": [f"how to solve problem {b} {p}?" for b, p, _ in rows],
            "base_id": pa.array([b for b, _, _ in rows], pa.int64()),
            "positive_id": pa.array([p for _, p, _ in rows], pa.int64()),
            "field": [f for _, _, f in rows],
            "domain": [f"domain of {f}" for _, _, f in rows],
        }
    )


def negatives_table(rows: list[tuple[str, int, str, int, bool]]) -> pa.Table:
    return pa.table(
        {
            "query_id": pa.array([r[0] for r in rows], pa.string()),
            "candidate_id": pa.array([r[1] for r in rows], pa.int64()),
            "group": pa.array([r[2] for r in rows], pa.string()),
            "position": pa.array([r[3] for r in rows], pa.int32()),
            "kept": pa.array([r[4] for r in rows], pa.bool_()),
        }
    )


def test_eval_takes_a_fixed_number_per_field_and_holds_out_what_would_leak():
    rows = [(b, 100 + b, "A") for b in range(10)] + [(20 + b, 200 + b, "B") for b in range(3)]
    rows += [(5, 300, "A")]  # a second query of base 5
    split = assign_split(queries_table(rows), eval_per_field=4, seed=0)
    by = dict(zip(split["query_id"].to_pylist(), split["split"].to_pylist()))
    drawn = [r for r in split.to_pylist() if r["split"] == EVAL]
    assert sum(1 for r in drawn if r["field"] == "A") == 4
    assert all(by[f"{20 + b}-{200 + b}"] == EVAL for b in range(3))  # a small field: all eval
    assert split["query_id"].to_pylist() == [f"{b}-{p}" for b, p, _ in rows]  # input order
    # the two queries of base 5 go together (a base paper's queries are drawn whole) or, when
    # base 5 was drawn last with one seat left, the one left over is held out
    assert by["5-105"] == by["5-300"] or HELD_OUT in (by["5-105"], by["5-300"])


def test_the_draw_is_seeded_and_stable_when_other_fields_grow():
    rows = [(b, 100 + b, "A") for b in range(30)]
    one = assign_split(queries_table(rows), eval_per_field=5, seed=1)
    grown = assign_split(
        queries_table(rows + [(50 + b, 500 + b, "B") for b in range(9)]), eval_per_field=5, seed=1
    )
    other = assign_split(queries_table(rows), eval_per_field=5, seed=2)
    assert grown["split"].to_pylist()[:30] == one["split"].to_pylist()
    assert other["split"].to_pylist() != one["split"].to_pylist()


def test_a_train_query_sharing_any_paper_with_eval_is_held_out():
    # 2-3's base is 1-2's positive; 3-1's positive is 1-2's base: with field A all eval...
    rows = [(1, 2, "A"), (2, 3, "B"), (3, 1, "B"), (7, 8, "B")]
    split = assign_split(queries_table(rows), eval_per_field=1, seed=0)
    by = dict(zip(split["query_id"].to_pylist(), split["split"].to_pylist()))
    assert by["1-2"] == EVAL and sorted(eval_papers(split).to_pylist())[:2] == [1, 2]
    b_eval = [q for q in ("2-3", "3-1", "7-8") if by[q] == EVAL]
    assert len(b_eval) == 1
    papers = set(eval_papers(split).to_pylist())
    for q in ("2-3", "3-1", "7-8"):
        if by[q] != EVAL:
            base, pos = map(int, q.split("-"))
            assert by[q] == (HELD_OUT if {base, pos} & papers else TRAIN)


def test_train_negatives_that_are_eval_papers_are_dropped_and_eval_pools_are_in_order():
    rows = [(1, 2, "A"), (5, 6, "B")]
    queries = queries_table(rows)
    split = assign_split(queries, eval_per_field=1, seed=0)
    split = split.set_column(4, "split", pa.array([EVAL, TRAIN]))  # as if drawn so
    negatives = negatives_table(
        [
            ("1-2", 12, "other", 0, True),
            ("1-2", 10, "shares_query_topic", 1, True),
            ("1-2", 11, "shares_positive_topic", 0, True),
            ("1-2", 13, "shares_query_topic", 0, True),
            ("1-2", 14, "shares_query_topic", 2, False),  # judged, not kept
            ("5-6", 2, "other", 0, True),  # the eval positive: never a train negative
            ("5-6", 20, "other", 1, True),
        ]
    )
    cpr_eval, cpr_train = split_tables(queries, split, negatives)
    (ev,) = cpr_eval.to_pylist()
    assert ev["candidate_ids"] == [2, 13, 10, 11, 12]
    assert ev["candidate_groups"] == [
        "positive",
        "shares_query_topic",
        "shares_query_topic",
        "shares_positive_topic",
        "other",
    ]
    assert ev["base_corpus_id"] == 1 and ev["field"] == "A" and ev["domain"] == "domain of A"
    assert cpr_train.to_pylist()[0]["negative_ids"] == [20]
    check_no_leakage(cpr_eval, cpr_train)


@pytest.mark.parametrize("role", ["base_corpus_id", "positive_id", "negative_ids", "query_id"])
def test_the_check_names_any_leak(role):
    queries = queries_table([(1, 2, "A"), (5, 6, "B")])
    split = assign_split(queries, eval_per_field=1, seed=0).set_column(
        4, "split", pa.array([EVAL, TRAIN])
    )
    cpr_eval, cpr_train = split_tables(queries, split, negatives_table([]))
    leaked = {
        "base_corpus_id": pa.array([2], pa.int64()),
        "positive_id": pa.array([1], pa.int64()),
        "negative_ids": pa.array([[30, 2]], pa.list_(pa.int64())),
        "query_id": pa.array(["1-2"]),
    }[role]
    bad = cpr_train.set_column(cpr_train.schema.get_field_index(role), role, leaked)
    with pytest.raises(LeakageError, match="CPR-train leaks CPR-eval"):
        check_no_leakage(cpr_eval, bad)


@st.composite
def builds(draw):
    """Random queries whose papers collide often (bases, positives and negatives share one
    small id range), random kept negatives, a random quota and seed."""
    n = draw(st.integers(1, 30))
    triples = draw(
        st.lists(
            st.tuples(st.integers(0, 25), st.integers(0, 40), st.sampled_from("ABC")),
            min_size=n,
            max_size=n,
            unique_by=lambda t: (t[0], t[1]),
        )
    )
    negatives = []
    for b, p, _ in triples:
        ids = draw(st.lists(st.integers(0, 40), max_size=8, unique=True))
        for pos, cid in enumerate(ids):
            negatives.append((f"{b}-{p}", cid, GROUPS[pos % 3], pos // 3, draw(st.booleans())))
    return triples, negatives, draw(st.integers(1, 6)), draw(st.integers(0, 2**31))


@settings(max_examples=60, deadline=None)
@given(builds())
def test_no_split_leaks(build):
    triples, negatives, per_field, seed = build
    queries = queries_table(triples)
    split = assign_split(queries, eval_per_field=per_field, seed=seed)
    cpr_eval, cpr_train = split_tables(queries, split, negatives_table(negatives))
    check_no_leakage(cpr_eval, cpr_train)  # the invariant, on the written tables

    s = dict(zip(split["query_id"].to_pylist(), split["split"].to_pylist()))
    for field in "ABC":
        n_field = sum(1 for t in triples if t[2] == field)
        n_eval = sum(1 for b, p, f in triples if f == field and s[f"{b}-{p}"] == EVAL)
        assert n_eval == min(n_field, per_field)
    papers = {x for b, p, _ in triples if s[f"{b}-{p}"] == EVAL for x in (b, p)}
    for b, p, _ in triples:  # held out exactly what would leak: train loses nothing else
        if s[f"{b}-{p}"] != EVAL:
            assert s[f"{b}-{p}"] == (HELD_OUT if {b, p} & papers else TRAIN)
    assert sorted(cpr_eval["query_id"].to_pylist() + cpr_train["query_id"].to_pylist()) == sorted(
        q for q, v in s.items() if v != HELD_OUT
    )
    kept = {}
    for q, cid, _, _, k in negatives:
        if k and cid not in papers:
            kept.setdefault(q, set()).add(cid)
    for row in cpr_train.to_pylist():  # train keeps every kept negative that is no eval paper
        assert set(row["negative_ids"]) == kept.get(row["query_id"], set())
