"""judge-negatives (§3.3 N2): the walk, pure, then the stage against the scripted endpoint.

`publish_fake_build` stands in for ingest and pool (a Lance papers table and pool's two tables
in its contract, with their manifests), so the dataset stages run without the whole pipeline.
"""

from __future__ import annotations

import math

import lance
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpr_ray.config import load_config
from cpr_ray.dataset.negatives import (
    GROUPS,
    NegativeGrader,
    eligible_candidates,
    judge_negatives,
    mark_kept,
    negative_stats,
    walk,
)
from cpr_ray.dataset.split import EVAL, TRAIN, assign_split, eval_papers
from cpr_ray.pooling.pool_schemas import CANDIDATES, QUERIES
from cpr_ray.queries.usefulness import UsefulnessGrader, grader_reference
from cpr_ray.runs.stage_runner import manifest_uri
from cpr_ray.storage.store import Storage, join
from cpr_ray.tables.schemas import PAPERS, passage, passages

ELIGIBLE = pa.schema(
    [
        ("query_id", pa.string()),
        ("candidate_id", pa.int64()),
        ("group", pa.string()),
        ("position", pa.int32()),
        ("split", pa.string()),
        ("need", pa.int32()),
    ]
)
FIELDS = {"Physics": "Physical Sciences", "Medicine": "Health Sciences"}
LICENSES = ("CCBY", "CCBYNC", None, "PD")


# -- the walk, pure ------------------------------------------------------------------------------


def eligible(groups: dict[tuple[str, str], int], need: dict[str, int]) -> pa.Table:
    """Candidates c{q}{group}{pos} for (query, group) -> how many."""
    rows = [
        (q, 1000 * (i + 1) + pos, g, pos, EVAL, need[q])
        for i, ((q, g), n) in enumerate(groups.items())
        for pos in range(n)
    ]
    return pa.Table.from_pylist([dict(zip(ELIGIBLE.names, r)) for r in rows], schema=ELIGIBLE)


def scorer(scores: dict[int, int | None], asked: list[int] | None = None):
    """A judge that reads each candidate's score from `scores` (None: an invalid answer)."""

    def judge(rows: pa.Table) -> pa.Table:
        ids = rows["candidate_id"].to_pylist()
        if asked is not None:
            asked.extend(ids)
        got = [scores[c] for c in ids]
        return rows.append_column("usefulness", pa.array(got, pa.int8())).append_column(
            "status", pa.array(["invalid" if s is None else "ok" for s in got])
        )

    return judge


def kept_ids(judged: pa.Table) -> list[int]:
    marked = mark_kept(judged, max_usefulness=1)
    return marked.filter(marked["kept"])["candidate_id"].to_pylist()


def test_fifty_per_group_for_eval_judging_only_what_the_walk_needs():
    table = eligible({("q", g): 120 for g in GROUPS}, {"q": 50})
    # every 10th candidate is useful (a false negative): 50 negatives need 56 candidates
    scores = {c: 3 if c % 10 == 9 else 0 for c in table["candidate_id"].to_pylist()}
    asked: list[int] = []
    done = walk(table, scorer(scores, asked), max_usefulness=1, margin=0.2)
    kept = kept_ids(done.judged)
    assert len(kept) == 150
    for i in range(len(GROUPS)):
        in_group = [c for c in kept if c // 1000 == i + 1]
        first = [c for c in range(1000 * (i + 1), 1000 * (i + 1) + 120) if scores[c] <= 1][:50]
        assert in_group == first  # the first 50 negatives in pool order
    # round 1: 50 + 10 margin per group, which holds 54 negatives: no second round
    assert done.rounds == 1 and len(asked) == 180 and len(set(asked)) == 180


def test_three_per_group_for_train_and_a_second_round_when_false_negatives_eat_the_margin():
    table = eligible({("t", g): 10 for g in GROUPS}, {"t": 3})
    scores = {c: 0 for c in table["candidate_id"].to_pylist()}
    for c in (1000, 1001, 1002):  # the first three of the first group are useful
        scores[c] = 2
    asked: list[int] = []
    done = walk(table, scorer(scores, asked), max_usefulness=1, margin=0.2)
    assert kept_ids(done.judged) == [1003, 1004, 1005, 2000, 2001, 2002, 3000, 3001, 3002]
    # round 1: 3 + 1 per group; round 2 only for the first group, 2 + 1 more
    assert done.rounds == 2
    assert sorted(asked) == [
        1000,
        1001,
        1002,
        1003,
        1004,
        1005,
        1006,
        2000,
        2001,
        2002,
        2003,
        3000,
        3001,
        3002,
        3003,
    ]


def test_short_groups_keep_all_they_have_and_invalid_answers_are_no_negatives():
    table = eligible({("s", "shares_query_topic"): 4, ("s", "other"): 1}, {"s": 3})
    scores = {1000: 0, 1001: None, 1002: 3, 1003: 1, 2000: 0}
    done = walk(table, scorer(scores), max_usefulness=1, margin=0.0)
    assert kept_ids(done.judged) == [1000, 1003, 2000]
    assert done.judged.num_rows == 5 and not done.capped  # every candidate, once


def test_budget_caps_the_rows_judged():
    table = eligible({("q", g): 20 for g in GROUPS}, {"q": 5})
    scores = {c: 0 for c in table["candidate_id"].to_pylist()}
    done = walk(table, scorer(scores), max_usefulness=1, margin=0.0, budget=7)
    assert done.judged.num_rows == 7 and done.capped
    assert walk(table, scorer(scores), max_usefulness=1, margin=0.0, budget=15).capped is False


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.lists(st.sampled_from([0, 1, 2, 3, None]), max_size=25), min_size=1, max_size=3),
    st.integers(1, 8),
    st.sampled_from([0.0, 0.2, 1.0]),
)
def test_the_walk_keeps_what_judging_everything_would_keep(groups, need, margin):
    """The rounds are an optimisation: the kept negatives equal those of judging every
    candidate, each group is judged as a prefix of its order, and only a margin beyond."""
    table = eligible({("q", GROUPS[i]): len(s) for i, s in enumerate(groups)}, {"q": need})
    scores = {
        1000 * (i + 1) + pos: s for i, group in enumerate(groups) for pos, s in enumerate(group)
    }
    done = walk(table, scorer(scores), max_usefulness=1, margin=margin)
    everything = walk(table, scorer(scores), max_usefulness=1, margin=1e9)
    assert sorted(kept_ids(done.judged)) == sorted(kept_ids(everything.judged))
    for i, group in enumerate(groups):
        judged = sorted(
            c - 1000 * (i + 1)
            for c in done.judged["candidate_id"].to_pylist()
            if c // 1000 == i + 1
        )
        assert judged == list(range(len(judged)))  # a prefix
        negatives = [p for p, s in enumerate(group) if s is not None and s <= 1]
        enough = negatives[need - 1] + 1 if len(negatives) >= need else len(group)
        assert enough <= len(judged) <= enough + math.ceil(need * margin)


def test_the_graders_passage_is_the_title_and_the_abstract_cut_at_2000_characters():
    titles = pa.chunked_array([["A title", None, " spaced ", "T", "é" * 2100]])
    abstracts = pa.chunked_array([["An abstract.", "only abstract", None, "é" * 2500, "x"]])
    got = passages(titles, abstracts).to_pylist()
    assert got[:3] == ["A title. An abstract.", "only abstract", "spaced"]
    assert got[3] == "T. " + "é" * 2000  # B.5: the abstract is cut, in characters
    assert got[4] == "é" * 2100 + ". x"  # the title is read whole
    assert passage("T", "é" * 2500) == got[3]


def test_a_positive_grader_reads_a_neutral_reference_and_a_negative_grader_none():
    """B.5/B.6: the positive's mappings come as a candidate correspondence that may not apply
    (its note a prompt file of its own, in the cache key), never as an earlier judge's proposal;
    the negative's prompt has no block and no note, and its key does not follow the note."""
    reference = grader_reference(
        [{"q_object": "sensor", "d_object": "neuron", "role": "signal source"}],
        [{"predicate": "Feeds", "q_arguments": ["a", "b"], "d_arguments": ["c", "d"]}],
    )
    row = {"query": "how to recover sparse signals?", "passage": "A passage."}
    positive = UsefulnessGrader().render(row | {"mappings": reference})
    negative = NegativeGrader().render(row | {"mappings": None})
    assert "candidate correspondence" in positive and "may not apply" in positive
    assert "sensor -> neuron (signal source)" in positive
    assert "earlier judge" not in positive and "proposed" not in positive
    assert "correspondence" not in negative and "Mappings:" not in negative
    assert UsefulnessGrader().prompt_version == "usefulness.v2+usefulness_reference.v1"
    assert NegativeGrader().prompt_version == "usefulness.v2"


# -- a fake build: ingest's papers and pool's tables ----------------------------------------------


def fake_pool(per_field: int = 4, per_group: int = 6, useful_every: int = 4) -> dict:
    """Papers, pool queries and candidates in pool's contract.

    Candidate titles say USELESS (the scripted grader scores 1) except every `useful_every`-th
    (scored 3: a false negative). Each query's first shares_query_topic candidate is the base
    paper of the query before it, and its first `other` candidate the positive of the next one,
    so train queries meet eval papers among their candidates.
    """
    papers, queries, candidates = [], [], []

    def paper(title: str, field: str) -> int:
        cid = 10_000 + len(papers)
        papers.append(
            {
                "corpus_id": cid,
                "title": title,
                "abstract": f"Abstract of paper {cid}.",
                "abstract_license": LICENSES[cid % len(LICENSES)],
                "year": 2015,
                "topics": [
                    {
                        "id": cid % 97,
                        "name": f"topic {cid % 97}",
                        "score": 0.9,
                        "subfield_id": 1,
                        "subfield": "sub",
                        "field_id": 2,
                        "field": field,
                        "domain_id": 3,
                        "domain": FIELDS[field],
                    }
                ],
                "field": field,
                "domain": FIELDS[field],
            }
        )
        return cid

    fields = list(FIELDS)
    for f_i, field in enumerate(fields):
        for k in range(per_field):
            other = fields[(f_i + k) % len(fields)]  # half the positives cross the field
            # the last query of a field shares its base paper with the first
            base = (
                queries[-k]["base_id"]
                if k == per_field - 1 and k
                else paper(f"USELESS base paper {field} {k}", field)
            )
            pos = paper(f"USELESS positive paper {field} {k}", other)
            queries.append(
                {
                    "query_id": f"{base}-{pos}",
                    "query": f"how to handle problem {k} in {field.lower()}?",
                    "base_id": base,
                    "positive_id": pos,
                    "field": field,
                    "domain": FIELDS[field],
                    "positive_field": other,
                    "positive_domain": FIELDS[other],
                    "crosses_field": other != field,
                    "crosses_domain": FIELDS[other] != FIELDS[field],
                    "base_date": None,
                }
            )
    for i, q in enumerate(queries):
        for g in GROUPS:
            ids = [
                paper(
                    ("promising" if (p + 1) % useful_every == 0 else "USELESS")
                    + f" candidate {g} {p}",
                    q["field"],
                )
                for p in range(per_group)
            ]
            if g == "shares_query_topic":
                ids[0] = queries[i - 1]["base_id"]
            if g == "other":
                ids[0] = queries[(i + 1) % len(queries)]["positive_id"]
            for p, cid in enumerate(ids):
                candidates.append(
                    {
                        "query_id": q["query_id"],
                        "candidate_id": cid,
                        "group": g,
                        "position": p,
                        "source": "pooled",
                        "poolers": ["bm25"],
                        "pooler_ranks": [p],
                    }
                )
    return {"papers": papers, "queries": queries, "candidates": candidates}


def scripted_walk(made: dict, cfg):
    """judge-negatives' walk over `fake_pool`'s candidates, pure, graded by the scripted
    endpoint's rule (a paper titled USELESS scores 1, any other 3)."""
    queries = pa.Table.from_pylist(made["queries"], schema=QUERIES)
    split = assign_split(queries, eval_per_field=cfg.dataset.eval_per_field, seed=cfg.dataset.seed)
    table = eligible_candidates(
        pa.Table.from_pylist(made["candidates"], schema=CANDIDATES), split, cfg.dataset
    )
    titles = {p["corpus_id"]: p["title"] for p in made["papers"]}
    grades = scorer({c: 1 if "USELESS" in titles[c] else 3 for c in titles})
    return walk(table, grades, max_usefulness=1, margin=cfg.dataset.negatives_margin)


def publish_fake_build(storage: Storage, made: dict) -> None:
    """Ingest's papers (Lance) and pool's tables under the storage root, with manifests."""
    root = storage.root
    papers_uri = join(root, "ingest", "runs", "r0", "papers.lance")
    papers = pa.Table.from_pylist(made["papers"], schema=PAPERS)
    lance.write_dataset(papers, papers_uri, storage_options=storage.lance_options())
    storage.write_json(
        manifest_uri(storage, "ingest"),
        {
            "stage": "ingest",
            "run_id": "r0",
            "tables": {"papers": {"uri": papers_uri, "format": "lance", "rows": papers.num_rows}},
            "stats": {"openalex_snapshot": "openalex updated_date<=2025-06-01"},
            "inputs": {"papers": "f00d", "works": "beef"},
            "config_hash": "c0",
            "complete": True,
        },
    )
    tables = {}
    for name, schema in (("queries", QUERIES), ("candidates", CANDIDATES)):
        uri = join(root, "pool", "runs", "p0", f"{name}.parquet")
        table = pa.Table.from_pylist(made[name], schema=schema)
        storage.write_parquet(table, uri)
        tables[name] = {"uri": uri, "format": "parquet", "rows": table.num_rows}
    storage.write_json(
        manifest_uri(storage, "pool"),
        {"stage": "pool", "run_id": "p0", "tables": tables, "stats": {}, "complete": True},
    )


def build_config(root: str, llm=None, *more: str):
    """The dry-run profile on `root`: 2 eval queries per field, 3 eval / 1 train negatives per
    group, no row cap unless `more` sets one."""
    return load_config(
        "dry-run",
        env={},
        overrides=[
            f"storage.root={root}",
            *([f"llm.base_url={llm.base_url}", "llm.stages={}"] if llm else []),
            "llm.model=scripted",
            "llm.max_in_flight=8",
            "llm.max_rows_per_stage=null",
            "dataset.eval_per_field=2",
            "dataset.eval_negatives_per_group=3",
            "dataset.train_negatives_per_group=1",
            *more,
        ],
    )


def test_eligible_candidates_keep_eval_papers_out_of_train():
    made = fake_pool()
    queries = pa.Table.from_pylist(made["queries"], schema=QUERIES)
    cands = pa.Table.from_pylist(made["candidates"], schema=CANDIDATES)
    cfg = build_config("/tmp/unused")
    split = assign_split(queries, eval_per_field=2, seed=0)
    table = eligible_candidates(cands, split, cfg.dataset)
    papers = set(eval_papers(split).to_pylist())
    train = table.filter(pa.compute.equal(table["split"], TRAIN))
    assert train.num_rows and not set(train["candidate_id"].to_pylist()) & papers
    ev = table.filter(pa.compute.equal(table["split"], EVAL))
    assert set(ev["need"].to_pylist()) == {3} and set(train["need"].to_pylist()) == {1}
    assert ev.num_rows == 4 * 3 * 6  # eval queries lose no candidate
    assert table["query_id"].to_pylist() == sorted(table["query_id"].to_pylist())


# -- the stage against the scripted endpoint ----------------------------------------------------


@pytest.mark.usefixtures("ray_session")
def test_judge_negatives_stage_then_zero_calls_on_rerun(tmp_path, llm):
    made = fake_pool(useful_every=2)
    cfg = build_config(str(tmp_path), llm)
    storage = Storage(cfg.storage)
    publish_fake_build(storage, made)

    m = judge_negatives(cfg, storage)
    stats = m["stats"]
    negatives = storage.read_parquet(m["tables"]["negatives"]["uri"])
    judged = storage.read_parquet(m["tables"]["judged"]["uri"])
    assert negatives.schema.names == [
        "query_id",
        "candidate_id",
        "group",
        "position",
        "usefulness",
        "kept",
        "split",
    ]
    assert judged.num_rows == negatives.num_rows == stats["judged"]
    assert set(judged["prompt_version"].to_pylist()) == {"usefulness.v2"}
    assert set(judged["model"].to_pylist()) == {"scripted"}
    assert set(judged["mappings"].to_pylist()) == {None}  # graded without mappings (B.6)
    assert llm.stats()["Usefulness"] == stats["asked"] == stats["judged"]

    # the same walk, pure, with the scripted grader's rule: what the stage judged and kept
    expected = scripted_walk(made, cfg)
    assert sorted(kept_ids(expected.judged)) == sorted(
        negatives.filter(negatives["kept"])["candidate_id"].to_pylist()
    )
    # every other candidate is useful: eval groups need a second round, train groups do not
    assert stats["rounds"] == expected.rounds == 2
    # one field's shared base paper: drawn for eval, or its train query is held out
    assert stats["queries"] == {EVAL: 4, TRAIN: 3, "held_out": 1}
    assert stats["negatives_kept"] == {EVAL: 4 * 3 * 3, TRAIN: 3 * 3}
    assert stats["short_groups"] == {EVAL: 0, TRAIN: 0}
    assert stats["false_negatives"] == stats["usefulness"]["3"] > 0
    assert m["complete"] and not stats["capped_by_max_rows_per_stage"]
    calls = llm.stats()["total"]

    again = judge_negatives(cfg, storage, force=True)
    assert llm.stats()["total"] == calls  # a rerun pays for nothing
    assert again["stats"]["asked"] == 0 and again["stats"]["cached"] == stats["judged"]

    capped = judge_negatives(build_config(str(tmp_path), llm, "llm.max_rows_per_stage=5"), storage)
    assert capped["stats"]["judged"] == 5 and capped["stats"]["capped_by_max_rows_per_stage"]
    assert capped["stats"]["short_groups"][EVAL] > 0


def test_stats_count_groups_the_pool_left_empty():
    split = pa.table(
        {
            "query_id": ["a", "b"],
            "base_id": pa.array([1, 2], pa.int64()),
            "positive_id": pa.array([3, 4], pa.int64()),
            "field": ["F", "F"],
            "split": [EVAL, "held_out"],
        }
    )
    table = eligible({("a", "other"): 2}, {"a": 3})
    done = walk(table, scorer({1000: 0, 1001: 3}), max_usefulness=1, margin=0.0)
    cfg = build_config("/tmp/unused", None, "dataset.eval_negatives_per_group=3")
    stats = negative_stats(split, cfg.dataset, mark_kept(done.judged, max_usefulness=1))
    assert stats["short_groups"] == {EVAL: 3, TRAIN: 0}  # two empty groups and one short
    assert stats["queries_with_short_groups"] == 1 and stats["false_negatives"] == 1
    assert stats["queries"] == {EVAL: 1, TRAIN: 0, "held_out": 1}
