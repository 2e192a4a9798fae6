"""Candidate pooling's pure rules (no Ray): the date rule and its year fallback, topic groups,
rejected citations, the round-robin fill order, group sizes and the query contract."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from cpr_ray.config import ConfigError, EncoderActors, load_config
from cpr_ray.pooling.pool_rules import (
    build_queries,
    deeper_queries,
    doc_text,
    earliest_date,
    group_sizes,
    latest_date,
    rejected_citations,
    round_robin,
    topic_group,
    topic_ids,
    universe_docs,
)
from cpr_ray.pooling.pool_schemas import CANDIDATES, DOCS, HITS, QUERIES, SEARCH_QUERIES

D = dt.date
INTS = pa.list_(pa.int32())


def test_dates_fall_back_to_the_edge_of_the_year_that_keeps_before_strict():
    dates = pa.array([D(2014, 5, 2), None, None], pa.date32())
    years = pa.array([2014, 2015, None], pa.int32())
    assert latest_date(dates, years).to_pylist() == [D(2014, 5, 2), D(2015, 12, 31), None]
    assert earliest_date(dates, years).to_pylist() == [D(2014, 5, 2), D(2015, 1, 1), None]
    # a candidate known only as 2015 never precedes a query of 2015, whatever its day …
    assert latest_date(dates, years)[1].as_py() >= D(2015, 12, 31)
    # … and one dated in 2014 precedes a query known only as 2015
    assert latest_date(dates, years)[0].as_py() < earliest_date(dates, years)[1].as_py()


def test_universe_docs_keep_universe_papers_with_an_abstract_and_a_known_day():
    topics = pa.list_(pa.struct([("id", pa.int32()), ("name", pa.string())]))
    papers = pa.table(
        {
            "corpus_id": pa.array([1, 2, 3, 4, 5], pa.int64()),
            "title": ["a", "b", "c", "d", "e"],
            "abstract": ["x", "  ", "x", "x", "x"],
            "publication_date": pa.array([D(2010, 1, 1), None, None, None, None], pa.date32()),
            "year": pa.array([2010, 2011, 2012, None, 2013], pa.int32()),
            "topics": pa.array([[{"id": 7, "name": "t"}], [], None, [], []], topics),
        }
    )
    docs = universe_docs(papers, pa.array([1, 2, 3, 4], pa.int64()))
    assert docs.schema == DOCS
    # 2: blank abstract; 4: no date nor year; 5: not in the universe
    assert docs["corpus_id"].to_pylist() == [1, 3]
    assert docs["date_key"].to_pylist() == [D(2010, 1, 1), D(2012, 12, 31)]
    assert docs["topic_ids"].to_pylist() == [[7], None]
    sliced = topic_ids(papers["topics"].combine_chunks().slice(0, 2))
    assert sliced.to_pylist() == [[7], []]


def test_topic_groups_query_topic_first_then_positive_only_then_other():
    groups = topic_group(
        pa.array([[1, 5], [5], [9], None, [2]], INTS),  # candidate topics
        pa.array([[1, 2], [1, 2], [1, 2], [1], None], INTS),  # q
        pa.array([[5], [5], [5], [5], [2]], INTS),  # positive
    )
    assert groups.to_pylist() == [
        "shares_query_topic",  # shares 1 with q (and 5 with the positive: q wins)
        "shares_positive_topic",
        "other",
        "other",  # no topics at all
        "shares_positive_topic",  # q has no topics
    ]


def test_doc_text_by_template():
    title, abstract = pa.array(["T", None]), pa.array(["A", "B"])
    assert doc_text(title, abstract, "{title}[SEP]{abstract}").to_pylist() == ["T[SEP]A", "[SEP]B"]
    assert doc_text(title, abstract, "{abstract}").to_pylist() == ["A", "B"]
    with pytest.raises(ValueError, match="names neither"):
        doc_text(title, abstract, "plain")


def test_pooler_config_is_checked():
    def load(poolers):
        return load_config("dry-run", env={}, overrides=[f"pooling.poolers={poolers}"])

    with pytest.raises(ConfigError, match="bm25 takes no encoder"):
        load("[{name: b, kind: bm25, encoder: {model: m}}]")
    with pytest.raises(ConfigError, match="dense needs encoder.model"):
        load("[{name: d, kind: dense}]")
    with pytest.raises(ConfigError, match="unique; repeated: b"):
        load("[{name: b, kind: bm25}, {name: b, kind: bm25}]")
    with pytest.raises(ConfigError, match="unknown: venue"):
        load("[{name: b, kind: bm25, doc_template: '{title} {venue}'}]")
    with pytest.raises(ConfigError, match="top_k_short 10 is below top_k 300"):
        load_config("dry-run", env={}, overrides=["pooling.top_k_short=10"])
    cluster = load_config("cluster", env={})
    assert [p.name for p in cluster.pooling.poolers] == ["e5", "splade", "scincl"]
    assert cluster.pooling.poolers[2].doc_template == "{title}[SEP]{abstract}"
    dry = load_config("dry-run", env={})
    assert [p.kind for p in dry.pooling.poolers] == ["dense", "bm25"]
    assert dry.pooling.poolers[0].encoder.model.endswith("model")  # {minilm} expanded


def _search_rows(**cols) -> pa.Table:
    n = len(cols["query_id"])
    base = {
        "query": ["q"] * n,
        "base_id": [100] * n,
        "base_date": [D(2020, 6, 1)] * n,
        "positive_id": [200] * n,
        "q_topics": [[1]] * n,
        "p_topics": [[2]] * n,
        "depth": [10] * n,
    }
    return pa.Table.from_pydict({**base, **cols}, schema=SEARCH_QUERIES)


def test_rejected_citations_are_ok_not_analogy_eligible_and_grouped():
    queries = _search_rows(query_id=["100-200"])
    judged = pa.table(
        {
            "base_id": [100] * 7 + [101],
            "cited_id": [1, 2, 3, 4, 200, 5, 1, 6],
            "status": ["ok", "ok", "failed", "ok", "ok", "ok", "ok", "ok"],
            "decision": [
                "not_analogy",
                "not_analogy",
                None,
                "observed_analogy",
                "not_analogy",
                "not_analogy",
                "not_analogy",
                "not_analogy",
            ],
        }
    )
    docs = pa.table(
        {
            "corpus_id": pa.array([1, 2, 3, 4, 5, 6, 200], pa.int64()),
            "date_key": pa.array([D(2019, 1, 1)] * 4 + [D(2020, 6, 1)] + [D(2019, 1, 1)] * 2),
            "topic_ids": pa.array([[1], [2], [1], [1], [1], [1], [2]], INTS),
        }
    )
    got = rejected_citations(judged, queries, docs).to_pylist()
    # 3 failed, 4 passed, 200 is the positive, 5 not before q, 6 another base paper's; 1 once
    assert got == [
        {"query_id": "100-200", "candidate_id": 1, "group": "shares_query_topic"},
        {"query_id": "100-200", "candidate_id": 2, "group": "shares_positive_topic"},
    ]


def _hits(rows: list[tuple]) -> pa.Table:
    names = ["query_id", "group", "candidate_id", "pooler", "rank"]
    return pa.Table.from_pylist([dict(zip(names, r)) for r in rows], schema=HITS)


def test_round_robin_merges_rank_by_rank_skips_duplicates_and_puts_rejected_first():
    g = "other"
    hits = _hits(
        [
            ("q", g, 10, "a", 0),
            ("q", g, 11, "a", 1),
            ("q", g, 12, "a", 2),
            ("q", g, 11, "b", 0),
            ("q", g, 13, "b", 1),
            ("q", g, 10, "b", 2),
            ("q", g, 14, "c", 0),
            ("q", g, 99, "c", 1),
            ("q", "shares_query_topic", 20, "b", 0),
        ]
    )
    rejected = pa.table({"query_id": ["q", "q"], "candidate_id": [99, 5], "group": [g, g]})
    depths = pa.table({"query_id": ["q"], "depth": [10]})
    out = round_robin(hits, rejected, ["a", "b", "c"], depths)
    assert out.schema == CANDIDATES
    rows = [r for r in out.to_pylist() if r["group"] == g]
    # rejected first (99, ranked by c, before 5, ranked by none); then rank 0 of a, b, c, rank 1…
    assert [r["candidate_id"] for r in rows] == [99, 5, 10, 11, 14, 13, 12]
    assert [r["position"] for r in rows] == list(range(7))
    assert [r["source"] for r in rows[:3]] == ["rejected_citation"] * 2 + ["pooled"]
    by_id = {r["candidate_id"]: r for r in rows}
    assert (by_id[10]["poolers"], by_id[10]["pooler_ranks"]) == (["a", "b"], [0, 2])
    assert (by_id[11]["poolers"], by_id[11]["pooler_ranks"]) == (["a", "b"], [1, 0])
    assert (by_id[5]["poolers"], by_id[5]["pooler_ranks"]) == ([], [])
    assert [r["group"] for r in out.to_pylist()][0] == "shares_query_topic"  # walk order
    # a group keeps at most its query's depth
    capped = round_robin(
        hits, rejected, ["a", "b", "c"], pa.table({"query_id": ["q"], "depth": [3]})
    )
    assert [r["candidate_id"] for r in capped.to_pylist() if r["group"] == g] == [99, 5, 10]


def test_group_sizes_count_empty_groups():
    cands = pa.Table.from_pylist(
        [
            {
                "query_id": "q",
                "candidate_id": 1,
                "group": "other",
                "position": 0,
                "source": "pooled",
                "poolers": ["a"],
                "pooler_ranks": [0],
            }
        ],
        schema=CANDIDATES,
    )
    sizes = group_sizes(cands, pa.array(["q", "r"]))
    assert sizes.to_pylist() == [
        {"query_id": "q", "group": "shares_query_topic", "candidates": 0},
        {"query_id": "q", "group": "shares_positive_topic", "candidates": 0},
        {"query_id": "q", "group": "other", "candidates": 1},
        {"query_id": "r", "group": "shares_query_topic", "candidates": 0},
        {"query_id": "r", "group": "shares_positive_topic", "candidates": 0},
        {"query_id": "r", "group": "other", "candidates": 0},
    ]


def test_only_a_short_group_that_a_full_list_could_grow_is_pooled_deeper():
    q, p = "shares_query_topic", "shares_positive_topic"
    hits = _hits(
        [("full", q, 1, "a", 0), ("full", q, 2, "a", 1)]  # a's list full at depth 2: may hold more
        + [("full", q, 3, "b", 0)]
        + [("exhausted", q, 1, "a", 0), ("exhausted", q, 3, "b", 0)]  # every list below depth 2
        + [("long", p, i, "a", i - 10) for i in (10, 11)]  # full at depth 2
        + [("long", q, 4, "b", 0)]
    )
    cands = round_robin(
        hits,
        pa.table(
            {"query_id": [], "candidate_id": [], "group": []},
            schema=pa.schema(
                [("query_id", pa.string()), ("candidate_id", pa.int64()), ("group", pa.string())]
            ),
        ),
        ["a", "b"],
        pa.table({"query_id": ["full", "exhausted", "long"], "depth": [2] * 3}),
    )
    sizes = group_sizes(cands, pa.array(["full", "exhausted", "long"]))
    # min_group_size 4: every query has short groups; "exhausted"'s lists are all below depth
    assert deeper_queries(sizes, hits, 4, 2).to_pylist() == ["full", "long"]
    # min_group_size 2: "full" holds 3; "long"'s short group (1) came from b's list of 1
    assert deeper_queries(sizes, hits, 2, 2).to_pylist() == []
    assert deeper_queries(sizes, hits, 3, 3).to_pylist() == []  # no list reached depth 3


def test_build_queries_follow_the_contract():
    positives = pa.table(
        {
            "query": ["How to a", "How to b", "How to a"],
            "base_id": pa.array([100, 101, 100], pa.int64()),
            "cited_id": pa.array([200, 201, 200], pa.int64()),
            "base_field": ["F", "G", "F"],
            "base_domain": ["X", "Y", "X"],
            "cited_field": ["H", "G", "H"],
            "cited_domain": ["Z", "Y", "Z"],
            "crosses_field": [True, False, True],
            "crosses_domain": [True, False, True],
        }
    )
    papers = pa.table(
        {
            "corpus_id": pa.array([100, 101, 200], pa.int64()),
            "publication_date": pa.array([D(2020, 6, 1), None, None], pa.date32()),
            "year": pa.array([2020, 2012, 2010], pa.int32()),
            "topic_ids": pa.array([[1], [2], [3]], INTS),
        }
    )
    queries, search = build_queries(positives, papers, depth=300)
    assert queries.schema == QUERIES and search.schema == SEARCH_QUERIES
    assert queries.num_rows == 2  # one per (base, positive)
    first, second = queries.to_pylist()
    assert first["query_id"] == "100-200" and first["field"] == "F"
    assert first["positive_field"] == "H" and first["base_date"] == D(2020, 6, 1)
    assert second["base_date"] == D(2012, 1, 1)  # year only: its earliest day
    assert search["p_topics"].to_pylist() == [[3], None]  # 201 unknown: no topics
    assert pc.all(pc.equal(search["depth"], 300)).as_py()


def test_retraining_into_the_same_folder_gives_the_pooling_store_and_the_index_new_keys(tmp_path):
    """Cached vectors are keyed by the model's files, not its name: a model retrained into the
    same folder (same names and sizes, new weights) is encoded again by pooling and search."""
    from cpr_ray.pooling.poolers import PoolerPlan
    from cpr_ray.retrieval.spec import EncoderSpec, query_identity, vector_identity

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"a" * 4096)
    spec = EncoderSpec(model=str(model))
    plan = PoolerPlan("m", "dense", "{title}. {abstract}", spec, EncoderActors(actors=1))
    key, record = plan.store_key, query_identity(spec)
    assert record["fingerprint"] == vector_identity(spec)["fingerprint"]
    other = EncoderActors(cpus_per_actor=2.0)
    assert PoolerPlan("m", "dense", "{title}", spec, other).store_key == key  # same vectors
    (model / "README.md").write_text("| an evaluation's new row |")  # the card, appended to
    (model / ".README.md.lock").write_text("")  # the card writer's lock
    assert plan.store_key == key and query_identity(spec) == record  # no vector changed

    (model / "model.safetensors").write_bytes(b"b" * 4096)  # the retrained weights
    assert plan.store_key != key
    assert query_identity(spec)["fingerprint"] != record["fingerprint"]
