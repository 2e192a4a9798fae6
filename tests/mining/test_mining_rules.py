"""Mining rules without Ray: top venues, equal-per-field sampling, topic disjointness."""

import gzip
import json

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from cpr_ray.mining import mining_rules as rules
from tests.builds import OPENALEX_SAMPLE


def _venues(rows):
    cols = [
        "venue_id",
        "name",
        "type",
        "field_id",
        "field",
        "domain_id",
        "domain",
        "two_year_mean_citedness",
        "n_papers",
        "field_share",
    ]
    types = [
        pa.string(),
        pa.string(),
        pa.string(),
        pa.int32(),
        pa.string(),
        pa.int32(),
        pa.string(),
        pa.float64(),
        pa.int64(),
        pa.float64(),
    ]
    return pa.table({c: pa.array([r.get(c) for r in rows], t) for c, t in zip(cols, types)})


def _venue(i, field, citedness, n=100, kind="journal"):
    return {
        "venue_id": f"v{i}",
        "name": f"V{i}",
        "type": kind,
        "field_id": field,
        "field": f"f{field}",
        "domain_id": 3,
        "domain": "Physical Sciences",
        "two_year_mean_citedness": citedness,
        "n_papers": n,
        "field_share": 1.0,
    }


def test_top_share_per_field_and_minimum_papers():
    rows = (
        [_venue(i, 17, float(i)) for i in range(10)]
        + [_venue(100 + i, 26, float(i)) for i in range(3)]
        + [_venue(200, 17, 99.0, n=3)]
    )  # best citedness but too few papers
    top = rules.top_venues(
        _venues(rows), top_share=0.2, min_papers=20, conference_policy="pool"
    ).to_pylist()
    assert [(r["venue_id"], r["rank"]) for r in top if r["field_id"] == 17] == [
        ("v9", 1),
        ("v8", 2),
    ]
    # ceil(0.2 * 3) = 1: a small field still gets its best venue
    assert [r["venue_id"] for r in top if r["field_id"] == 26] == ["v102"]


def test_conference_policies():
    rows = [_venue(i, 17, 5.0 + i) for i in range(5)] + [
        _venue(10 + i, 17, 0.5 + i / 10, kind="conference") for i in range(5)
    ]
    venues = _venues(rows)

    def ids(policy):
        return {
            r["venue_id"]
            for r in rules.top_venues(
                venues, top_share=0.2, min_papers=1, conference_policy=policy
            ).to_pylist()
        }

    assert ids("pool") == {"v4", "v3"}  # conferences' low citedness pushes them all out
    assert ids("rank_separately") == {"v4", "v14"}  # the best conference survives on its own
    assert ids("exclude") == {"v4"}


def _eligible(n_per_field):
    rows = []
    for field, n in n_per_field.items():
        for i in range(n):
            rows.append({"corpus_id": field * 1000 + i, "field_id": field, "field": f"f{field}"})
    t = pa.table(
        {
            "corpus_id": pa.array([r["corpus_id"] for r in rows], pa.int64()),
            "field_id": pa.array([r["field_id"] for r in rows], pa.int32()),
            "field": [r["field"] for r in rows],
        }
    )
    from cpr_ray.tables import duckdb_sql as duck

    return duck.query(f"SELECT *, {rules.sampling_key_sql(7)} AS sample_key FROM t", t=t)


def test_equal_number_per_field_with_a_seed():
    eligible = _eligible({11: 40, 17: 9, 26: 25})
    drawn, report = rules.sample_per_field(eligible, None)
    counts = {r["field_id"]: (r["eligible"], r["drawn"]) for r in report.to_pylist()}
    assert counts == {11: (40, 9), 17: (9, 9), 26: (25, 9)}
    again, _ = rules.sample_per_field(eligible, None)
    assert drawn["corpus_id"].to_pylist() == again["corpus_id"].to_pylist()
    drawn5, report5 = rules.sample_per_field(eligible, 5)
    assert {r["field_id"]: r["drawn"] for r in report5.to_pylist()} == {11: 5, 17: 5, 26: 5}
    # a prefix of the same seeded order: 5 drawn are among the 9 drawn
    assert set(drawn5["corpus_id"].to_pylist()) <= set(drawn["corpus_id"].to_pylist())


def test_the_draw_from_each_buckets_cap_is_the_draw_from_every_eligible_paper():
    """What lets a bucket (a build) or a refresh (its kept eligible set, all buckets at once)
    hand the per-field draw only each bucket's first `cap` papers: the drawn papers are the
    same, and a paper that leaves lets the next of its field in, whichever bucket holds it."""
    eligible = _eligible({11: 60, 17: 7, 26: 33})
    whole, _ = rules.sample_per_field(eligible, 5)
    capped = rules.cap_per_bucket(eligible, 5, 4)
    per_bucket = capped.group_by(["field_id"]).aggregate([("corpus_id", "count")])
    assert max(per_bucket["corpus_id_count"].to_pylist()) <= 5 * 4 < eligible.num_rows
    drawn, _ = rules.sample_per_field(capped, 5)
    assert drawn.equals(whole)
    first = whole["corpus_id"][0].as_py()
    left = eligible.filter(pc.not_equal(eligible["corpus_id"], first))
    redrawn, _ = rules.sample_per_field(rules.cap_per_bucket(left, 5, 4), 5)
    assert redrawn.equals(rules.sample_per_field(left, 5)[0])
    assert first not in redrawn["corpus_id"].to_pylist() and redrawn.num_rows == whole.num_rows
    assert rules.cap_per_bucket(eligible, None, 4) is eligible


def test_another_seed_draws_another_sample():
    from cpr_ray.tables import duckdb_sql as duck

    eligible = _eligible({11: 200})
    other = duck.query(
        f"SELECT * EXCLUDE (sample_key), {rules.sampling_key_sql(8)} AS sample_key FROM e",
        e=eligible,
    )
    a, _ = rules.sample_per_field(eligible, 20)
    b, _ = rules.sample_per_field(other, 20)
    assert set(a["corpus_id"].to_pylist()) != set(b["corpus_id"].to_pylist())


def _real_works():
    with gzip.open(OPENALEX_SAMPLE, "rt") as f:
        return {w["id"]: w for w in map(json.loads, f)}


def test_disjointness_on_real_openalex_topics():
    works = _real_works()
    wid = lambda url: int(url.rsplit("W", 1)[1])  # noqa: E731
    pairs = [
        (w, works[r])
        for w in works.values()
        for r in w["referenced_works"]
        if r in works and r != w["id"] and w["topics"]
    ]
    expected = {
        (wid(q["id"]), wid(d["id"]))
        for q, d in pairs
        if d["topics"] and not ({t["id"] for t in q["topics"]} & {t["id"] for t in d["topics"]})
    }
    assert 1000 < len(expected) < len(pairs)  # the sample's README: 1,264 topic-disjoint

    def topic_ids(w):
        return [int(t["id"].rsplit("T", 1)[1]) for t in w["topics"]]

    def level(w, name):
        return int(w["topics"][0][name]["id"].rsplit("/", 1)[1]) if w["topics"] else None

    def field(w):
        return level(w, "field")

    def domain(w):
        return level(w, "domain")

    candidates = pa.table(
        {
            "base_id": pa.array([wid(q["id"]) for q, _ in pairs], pa.int64()),
            "cited_id": pa.array([wid(d["id"]) for _, d in pairs], pa.int64()),
            "contexts": pa.array([[] for _ in pairs], pa.list_(pa.string())),
            "context_source": pa.array([None] * len(pairs), pa.string()),
            "intents": pa.array([[] for _ in pairs], pa.list_(pa.string())),
            "is_influential": [False] * len(pairs),
            "base_topics": pa.array([topic_ids(q) for q, _ in pairs], pa.list_(pa.int32())),
            "base_top_topic": [q["topics"][0]["display_name"] for q, _ in pairs],
            "base_field_id": pa.array([field(q) for q, _ in pairs], pa.int32()),
            "base_field": ["x"] * len(pairs),
            "base_domain": ["y"] * len(pairs),
            "base_primary_field_id": pa.array([field(q) for q, _ in pairs], pa.int32()),
            "base_primary_domain_id": pa.array([domain(q) for q, _ in pairs], pa.int32()),
        }
    )
    cited_ids = sorted({wid(d["id"]) for _, d in pairs})
    by_id = {wid(w["id"]): w for w in works.values()}
    topic_type = pa.list_(pa.struct([("id", pa.int32()), ("name", pa.string())]))
    cited = pa.table(
        {
            "corpus_id": pa.array(cited_ids, pa.int64()),
            "topics": pa.array(
                [
                    [
                        {"id": i, "name": t["display_name"]}
                        for i, t in zip(topic_ids(by_id[c]), by_id[c]["topics"])
                    ]
                    or None
                    for c in cited_ids
                ],
                topic_type,
            ),
            "field_id": pa.array([field(by_id[c]) for c in cited_ids], pa.int32()),
            "field": ["z"] * len(cited_ids),
            "domain_id": pa.array([domain(by_id[c]) for c in cited_ids], pa.int32()),
            "domain": ["w"] * len(cited_ids),
        }
    )
    out = rules.cross_topic_pairs(candidates, cited)
    got = set(zip(out["base_id"].to_pylist(), out["cited_id"].to_pylist()))
    assert got == expected
    for row in out.to_pylist():
        assert not set(row["base_topics"]) & set(row["cited_topics"])
    # cross-field share, checked by hand on the same records
    crossing = sum(
        1 for q, d in pairs if (wid(q["id"]), wid(d["id"])) in expected and field(q) != field(d)
    )
    assert sum(out["crosses_field"].to_pylist()) == crossing


@pytest.mark.parametrize(
    "base,cited,disjoint",
    [
        ([1, 2, 3], [4, 5], True),
        ([1, 2, 3], [3], False),
        ([1], [], None),  # a side without topics can never be judged cross-topic
    ],
)
def test_disjointness_edge_cases(base, cited, disjoint):
    candidates = pa.table(
        {
            "base_id": pa.array([1], pa.int64()),
            "cited_id": pa.array([2], pa.int64()),
            "contexts": pa.array([["s"]], pa.list_(pa.string())),
            "context_source": ["s2"],
            "intents": pa.array([[]], pa.list_(pa.string())),
            "is_influential": [True],
            "base_topics": pa.array([base], pa.list_(pa.int32())),
            "base_top_topic": ["t"],
            "base_field_id": pa.array([17], pa.int32()),
            "base_field": ["CS"],
            "base_domain": ["PS"],
            "base_primary_field_id": pa.array([17], pa.int32()),
            "base_primary_domain_id": pa.array([3], pa.int32()),
        }
    )
    topic_type = pa.list_(pa.struct([("id", pa.int32()), ("name", pa.string())]))
    cited_t = pa.table(
        {
            "corpus_id": pa.array([2], pa.int64()),
            "topics": pa.array([[{"id": i, "name": "n"} for i in cited]], topic_type),
            "field_id": pa.array([26], pa.int32()),
            "field": ["Math"],
            "domain_id": pa.array([3], pa.int32()),
            "domain": ["PS"],
        }
    )
    out = rules.cross_topic_pairs(candidates, cited_t).to_pylist()
    assert (len(out) == 1) == bool(disjoint)
    if disjoint:
        assert out[0]["crosses_field"] and not out[0]["crosses_domain"] and out[0]["has_context"]
