"""The `pool` stage end to end on Ray: on the bundled sample's build (a copy of the session's
`sample_positives`) locally, and on a small hand-made build on S3 (moto) whose candidates are
known exactly, its universe in three shards; reruns are skipped, and a rerun with the sample's
universe in shards gives the same candidates, every embedding served by the store. The dense
pooler is the tiny random Qwen3 (last-token pooling): the rules under test do not depend on what
the vectors mean."""

from __future__ import annotations

import datetime as dt
import os
from collections import Counter
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from cpr_ray.config import load_config  # noqa: E402
from cpr_ray.pipeline.build import run_build  # noqa: E402
from cpr_ray.pooling.pool_rules import earliest_date, latest_date  # noqa: E402
from cpr_ray.pooling.pool_schemas import CANDIDATES, GROUPS, QUERIES  # noqa: E402
from cpr_ray.pooling.pool_stage import pool  # noqa: E402
from cpr_ray.runs.stage_runner import manifest_uri, read_manifest  # noqa: E402
from cpr_ray.storage.store import Storage, join  # noqa: E402
from cpr_ray.tables.buckets import BucketLayout  # noqa: E402
from cpr_ray.tables.schemas import PAPERS  # noqa: E402
from tests.builds import copy_build, scripted_config  # noqa: E402
from tests.retrieval.test_retrieval import tiny_models  # noqa: E402, F401  (the tiny SPLADE fixture)

pytestmark = pytest.mark.usefixtures("ray_session")

BEFORE_POOL = [
    "ingest",
    "venues",
    "mine",
    "judge-analogy",
    "judge-transfer",
    "write-queries",
    "dedup",
    "score-positives",
]


def poolers(dense: str, splade: str | None = None) -> str:
    """A dense encoder (short texts to keep the test quick), the tiny random SPLADE when given,
    BM25."""
    sparse = (
        f"{{name: splade, kind: splade, encoder: {{model: '{splade}', max_length: 64, "
        "device: cpu, actors: 1}}, "
        if splade
        else ""
    )
    return (
        f"[{{name: dense, kind: dense, encoder: {{model: '{dense}', max_length: 64, "
        "device: cpu}}, " + sparse + "{name: bm25, kind: bm25, doc_template: '{title} {abstract}'}]"
    )


def _papers(storage: Storage, papers_uri: str) -> dict[int, dict]:
    t = lance.dataset(papers_uri, storage_options=storage.lance_options()).to_table(
        columns=["corpus_id", "abstract", "publication_date", "year", "topics"]
    )
    latest = latest_date(t["publication_date"], t["year"]).to_pylist()
    earliest = earliest_date(t["publication_date"], t["year"]).to_pylist()
    return {
        row["corpus_id"]: {
            "abstract": (row["abstract"] or "").strip(),
            "latest": latest[i],
            "earliest": earliest[i],
            "topics": {x["id"] for x in row["topics"] or []},
        }
        for i, row in enumerate(t.to_pylist())
    }


def expected_group(paper: dict, base: dict, positive: dict | None) -> str:
    if paper["topics"] & base["topics"]:
        return "shares_query_topic"
    if positive and paper["topics"] & positive["topics"]:
        return "shares_positive_topic"
    return "other"


def check_pool(storage: Storage, m: dict, upstream: dict[str, str]) -> tuple[pa.Table, pa.Table]:
    """The contract and every rule, checked row by row against ingest's papers."""
    queries = storage.read_parquet(m["tables"]["queries"]["uri"])
    candidates = storage.read_parquet(m["tables"]["candidates"]["uri"])
    assert queries.schema == QUERIES and candidates.schema == CANDIDATES
    papers = _papers(storage, upstream["papers"])
    universe = set(
        storage.read_parquet(upstream["universe"], ["corpus_id"])["corpus_id"].to_pylist()
    )
    positives = storage.read_parquet(upstream["positives"], ["base_id", "cited_id"])
    assert queries.num_rows == positives.num_rows
    assert sorted(queries["query_id"].to_pylist()) == sorted(
        f"{b}-{c}"
        for b, c in zip(positives["base_id"].to_pylist(), positives["cited_id"].to_pylist())
    )
    by_query = {q["query_id"]: q for q in queries.to_pylist()}
    seen: dict[tuple[str, str], list[dict]] = {}
    for row in candidates.to_pylist():
        q = by_query[row["query_id"]]
        paper, base = papers[row["candidate_id"]], papers[q["base_id"]]
        assert q["base_date"] == base["earliest"]
        assert row["candidate_id"] in universe and paper["abstract"]
        assert paper["latest"] < q["base_date"]  # published before q
        assert row["candidate_id"] not in (q["base_id"], q["positive_id"])
        assert row["group"] == expected_group(paper, base, papers.get(q["positive_id"]))
        assert len(row["poolers"]) == len(row["pooler_ranks"])
        assert row["poolers"] or row["source"] == "rejected_citation"
        seen.setdefault((row["query_id"], row["group"]), []).append(row)
    for rows in seen.values():
        assert [r["position"] for r in rows] == list(range(len(rows)))
        sources = [r["source"] for r in rows]
        assert sources == sorted(sources, key=lambda s: s != "rejected_citation")  # first
        assert len({r["candidate_id"] for r in rows}) == len(rows)
    stats = m["stats"]
    assert stats["queries"] == queries.num_rows and stats["candidates"] == candidates.num_rows
    assert set(stats["candidates_per_group"]) == set(GROUPS)
    assert {"prepare", "encode", "index", "search", "merge"} <= set(stats["phase_seconds"])
    return queries, candidates


@pytest.mark.slow
def test_pool_on_the_sample_build_with_rejected_citations_first(
    sample_positives,
    tmp_path,
    llm,
    tiny_models,  # noqa: F811
):
    root = copy_build(sample_positives, tmp_path / "build")
    # one encoding pooler and BM25 (the S3 test below pools with SPLADE too); lists of 3 are
    # full, so the groups short of 5 are pooled again at 300
    cfg_overrides = [
        f"pooling.poolers={poolers(tiny_models['qwen'])}",
        "pooling.top_k=3",
        "pooling.top_k_short=300",
        "pooling.min_group_size=5",
        # the universe is more than one actor call: the build encodes it on the actor pool
        f"pooling.encode_batch_rows={ONE_CALL}",
    ]
    cfg = scripted_config(root, llm, *cfg_overrides)
    manifests = run_build(cfg, BEFORE_POOL)  # the shared build's: all skipped
    storage = Storage(cfg.storage)
    # the scripted judge accepts every pair: reject every judged pair that is not a positive, as
    # a real judge does most (and dedup would have dropped them anyway)
    judged_uri = manifests["judge-analogy"]["tables"]["judged"]["uri"]
    judged = storage.read_parquet(judged_uri)
    positives = storage.read_parquet(manifests["score-positives"]["tables"]["positives"]["uri"])
    pos_keys = pc.binary_join_element_wise(
        pc.cast(positives["base_id"], pa.string()), pc.cast(positives["cited_id"], pa.string()), "-"
    )
    keys = pc.binary_join_element_wise(
        pc.cast(judged["base_id"], pa.string()), pc.cast(judged["cited_id"], pa.string()), "-"
    )
    reject = pc.invert(pc.is_in(keys, value_set=pos_keys))
    judged = judged.set_column(
        judged.schema.get_field_index("decision"),
        "decision",
        pc.if_else(reject, "not_analogy", judged["decision"]),
    )
    storage.write_parquet(judged, judged_uri)

    m = run_build(cfg, ["pool"])["pool"]
    upstream = {
        "papers": manifests["ingest"]["tables"]["papers"]["uri"],
        "universe": manifests["mine"]["tables"]["universe"]["uri"],
        "positives": manifests["score-positives"]["tables"]["positives"]["uri"],
    }
    queries, candidates = check_pool(storage, m, upstream)
    assert queries.num_rows == positives.num_rows > 0
    # every eligible rejected citation of a query's base paper heads its group
    papers, universe = (
        _papers(storage, upstream["papers"]),
        storage.read_parquet(upstream["universe"], ["corpus_id"])["corpus_id"].to_pylist(),
    )
    rejected = candidates.filter(pc.equal(candidates["source"], "rejected_citation"))
    expected = {
        (q["query_id"], j["cited_id"])
        for q in queries.to_pylist()
        for j in judged.filter(reject).to_pylist()
        if j["base_id"] == q["base_id"]
        and j["cited_id"] in universe
        and papers[j["cited_id"]]["abstract"]
        and papers[j["cited_id"]]["latest"] < q["base_date"]
    }
    assert expected, "the sample build should give a rejected citation to pool first"
    got = set(zip(rejected["query_id"].to_pylist(), rejected["candidate_id"].to_pylist()))
    assert got == expected
    stats = m["stats"]
    assert stats["rejected_citations"] == len(expected)
    assert stats["poolers"]["dense"]["index"] == "Flat"
    assert stats["poolers"]["dense"]["encoded"] == stats["universe"]
    assert all(stats["poolers"][p]["hits"] > 0 for p in ("dense", "bm25"))
    assert stats["queries_pooled_deeper"] >= 1 and "search_short" in stats["phase_seconds"]

    again = run_build(cfg, ["pool"])["pool"]
    assert again["run_id"] == m["run_id"]  # same inputs and config: skipped
    check_reuse(storage, cfg, upstream["universe"], candidates, queries.num_rows)

    # the universe in shards of a few hundred papers (another config: another run), each shard
    # indexed and searched alone and the lists merged: exactly the candidates of one index,
    # BM25's and the deeper search included; every vector served by the embedding store but
    # those of a few texts it lost, which, one actor call's worth, are encoded in one task
    assert stats["universe"] > ONE_CALL >= REENCODED
    forget_vectors(root, REENCODED)
    small = max(1, stats["universe"] // 4)
    sharded = run_build(
        scripted_config(root, llm, *cfg_overrides, f"pooling.shard_vectors={small}"), ["pool"]
    )["pool"]
    assert sharded["run_id"] != m["run_id"]
    assert sharded["stats"]["universe_shards"] >= 4 and stats["universe_shards"] == 1
    for p in ("dense", "bm25"):  # BM25 too: each shard with the universe's statistics
        assert sharded["stats"]["poolers"][p]["shards"] == sharded["stats"]["universe_shards"]
    assert sharded["stats"]["poolers"]["dense"]["encoded"] == REENCODED
    assert sharded["stats"]["queries_pooled_deeper"] == stats["queries_pooled_deeper"]
    assert storage.read_parquet(sharded["tables"]["candidates"]["uri"]).equals(candidates)


ONE_CALL, REENCODED = 64, 8  # pooling.encode_batch_rows; texts the store loses
LISTS = ("hits.parquet", "short.parquet")  # a run's kept dense lists (pool_stage._keep)


def check_reuse(
    storage: Storage, cfg: Any, universe_uri: str, candidates: pa.Table, queries: int
) -> None:
    """A refresh's pool (`refresh.incremental`, the default) reuses the dense lists the run
    before kept: three papers of those lists leave mine's universe; the queries whose lists held
    them are searched again, the others keep theirs, and the candidates are exactly a full run's
    (`refresh.incremental=false`) over the smaller universe, the deeper search included. (The
    merge of added papers into kept lists: `test_pooling_search`'s kept-lists tests.)"""
    # three papers of the dense lists the run kept, those in the lists of the fewest queries
    kept = join(read_manifest(storage, "pool")["output"], "kept")
    lists = pa.concat_tables(storage.read_parquet(join(kept, f)) for f in LISTS)
    pairs = {(r["candidate_id"], r["query_id"]) for r in lists.to_pylist()}
    counts = Counter(c for c, _ in pairs)
    gone = pa.array(sorted(counts, key=lambda c: (counts[c], c))[:3], pa.int64())
    assert pc.any(pc.is_in(candidates["candidate_id"], value_set=gone)).as_py()
    whole = {
        f.base_name: storage.read_parquet(join(universe_uri, f.base_name))
        for f in storage.list_files(universe_uri, (".parquet",))
    }

    def universe(without: pa.Array) -> None:
        for name, t in whole.items():
            keep = pc.invert(pc.is_in(t["corpus_id"], value_set=without))
            storage.write_parquet(t.filter(keep), join(universe_uri, name))

    def pool_again(config: Any) -> tuple[dict, pa.Table]:
        m = run_build(config, ["pool"], force=True)["pool"]
        return m["stats"]["reuse"], storage.read_parquet(m["tables"]["candidates"]["uri"])

    universe(gone)
    reuse, again = pool_again(cfg)  # the queries whose lists held them search again
    assert reuse["reused"] and 0 < reuse["queries_kept"] < queries
    assert (reuse["papers_added"], reuse["papers_removed"]) == (0, len(gone))
    off = cfg.model_copy(update={"refresh": cfg.refresh.model_copy(update={"incremental": False})})
    reuse, fewer = pool_again(off)
    assert reuse == {"reused": False, "why": "refresh.incremental is false"}
    assert not pc.any(pc.is_in(fewer["candidate_id"], value_set=gone)).as_py()
    assert again.equals(fewer)
    universe(pa.array([], pa.int64()))


def forget_vectors(root: Path, n: int) -> None:
    """The document store of the one encoding pooler without the vectors of `n` texts (as if
    they were new), its parts rewritten as one."""
    [store] = [d for d in (root / "_embeddings").iterdir() if not d.name.startswith("queries-")]
    kept = pq.read_table(store).slice(n)
    for part in store.rglob("*.parquet"):
        part.unlink()
    pq.write_table(kept, store / "part-kept.parquet")


# -- a hand-made build on S3 --------------------------------------------------------------------
D = dt.date
WORDS = ["graph", "diffusion", "protein", "market", "quantum", "neural", "soil", "crystal"]


def _paper(cid: int, date: D | None, year: int | None, topics: list[int], abstract: str | None):
    words = " ".join(WORDS[(cid + k) % len(WORDS)] for k in range(3))
    return {
        "corpus_id": cid,
        "title": f"On {words}",
        "abstract": abstract if abstract is not None else None,
        "abstract_length": len(abstract or ""),
        "year": year if year is not None else (date.year if date else None),
        "publication_date": date,
        "topics": [{"id": t, "name": f"t{t}", "score": 1.0} for t in topics],
        "field": "F",
        "domain": "X",
    }


def small_world() -> dict[str, list[dict]]:
    """Two queries: q1 (id 1, 2020-06-01, topic 1; positive 11, topic 10) and q2 (id 2, known
    only as 2012, topic 2; positive 12, topic 20); 40 candidates over topics 1, 10, 2, 20, 99,
    some dated after q1, some known by year only, one without abstract, one outside the
    universe; q1's judged citations: 103 rejected, 131 rejected but later than q1, 104 failed."""
    text = "We study {w} structures and {w} dynamics in detail."
    papers = [
        _paper(1, D(2020, 6, 1), None, [1], text.format(w="graph")),
        _paper(2, None, 2012, [2], text.format(w="market")),
        _paper(11, D(2018, 1, 1), None, [10], text.format(w="diffusion")),
        _paper(12, None, 2010, [20], text.format(w="soil")),
    ]
    for i in range(40):
        cid, topics = 100 + i, [[1], [10], [2], [20], [99]][i % 5]
        date, year = D(2011, 3, 1) + dt.timedelta(days=40 * i), None
        if cid in (105, 106):  # known by year only
            date, year = None, 2019 + (cid - 105)  # 105: 2019 (< q1), 106: 2020 (not < q1)
        if cid >= 130:
            date = D(2021, 1, 1) + dt.timedelta(days=i)
        abstract = None if cid == 135 else text.format(w=WORDS[i % len(WORDS)])
        papers.append(_paper(cid, date, year, topics, abstract))
    universe = [p["corpus_id"] for p in papers if p["corpus_id"] != 136]
    positives = [
        {
            "query": "How to find graph structure under noise",
            "base_id": 1,
            "cited_id": 11,
            "base_field": "F",
            "base_domain": "X",
            "cited_field": "G",
            "cited_domain": "Y",
            "crosses_field": True,
            "crosses_domain": True,
        },
        {
            "query": "How to price market risk",
            "base_id": 2,
            "cited_id": 12,
            "base_field": "H",
            "base_domain": "Y",
            "cited_field": "H",
            "cited_domain": "Y",
            "crosses_field": False,
            "crosses_domain": False,
        },
    ]
    judged = [
        {"base_id": 1, "cited_id": 11, "status": "ok", "decision": "observed_analogy"},
        {"base_id": 1, "cited_id": 103, "status": "ok", "decision": "not_analogy"},
        {"base_id": 1, "cited_id": 131, "status": "ok", "decision": "not_analogy"},
        {"base_id": 1, "cited_id": 104, "status": "failed", "decision": None},
        {"base_id": 2, "cited_id": 12, "status": "ok", "decision": "potential_analogy"},
    ]
    return {"papers": papers, "universe": universe, "positives": positives, "judged": judged}


def publish_world(storage: Storage, world: dict[str, list[dict]]) -> dict[str, str]:
    """The upstream stages' published tables and manifests, as pool reads them."""
    uris = {}

    def publish(stage: str, table: str, uri: str, fmt: str = "parquet", **extra: Any) -> None:
        storage.write_json(
            manifest_uri(storage, stage),
            {
                "stage": stage,
                "run_id": f"{stage}-0",
                "complete": True,
                "tables": {table: {"uri": uri, "format": fmt, "rows": 0, **extra}},
            },
        )

    papers_uri = join(storage.root, "ingest", "runs", "0", "papers.lance")
    table = pa.Table.from_pylist(world["papers"], schema=PAPERS)
    written = lance.write_dataset(table, papers_uri, storage_options=storage.lance_options())
    # one key bucket: its fragments are read with the predicate corpus_id % 1 = 0, i.e. whole
    layout = BucketLayout("corpus_id", 1, {}).as_dict()
    publish("ingest", "papers", papers_uri, "lance", version=written.version, layout=layout)
    uris["papers"] = papers_uri
    for stage, name, rows in [
        ("mine", "universe", pa.table({"corpus_id": pa.array(world["universe"], pa.int64())})),
        ("judge-analogy", "judged", pa.Table.from_pylist(world["judged"])),
        ("score-positives", "positives", pa.Table.from_pylist(world["positives"])),
    ]:
        uri = join(storage.root, stage, "runs", "0", f"{name}.parquet")
        if name == "universe":  # mine writes it in the papers' key buckets (here one)
            uri = join(storage.root, stage, "runs", "0", name)
            storage.write_parquet(rows, join(uri, "part-00000.parquet"))
        else:
            storage.write_parquet(rows, uri)
        publish(stage, name, uri)
        uris[name] = uri
    return uris


def test_pool_on_s3_gives_exactly_the_eligible_papers_of_each_group(
    s3_endpoint,
    s3_bucket,
    tiny_models,  # noqa: F811
):
    cfg = load_config(
        "dry-run",
        env={},
        overrides=[
            f"storage.root=s3://{s3_bucket}/build",
            f"storage.s3_endpoint={s3_endpoint}",
            f"pooling.poolers={poolers(tiny_models['qwen'], tiny_models['splade'])}",
            "pooling.min_group_size=5",
            "pooling.shard_vectors=15",  # 3 shards of the 42 papers' universe
        ],
    )
    storage = Storage(cfg.storage)
    world = small_world()
    upstream = publish_world(storage, world)
    m = pool(cfg, storage)
    queries, candidates = check_pool(storage, m, upstream)
    assert m["output"].startswith(f"s3://{s3_bucket}/build/pool/runs/")
    assert m["stats"]["poolers"]["splade"]["index"] == "sparse"

    got = {}
    for row in candidates.to_pylist():
        got.setdefault((row["query_id"], row["group"]), []).append(row["candidate_id"])
    # depth 300 exceeds every group, so each group holds every eligible paper of it
    eligible_q1 = [c for c in range(100, 130) if c not in (106,)]  # 106: 2020, not before
    eligible_q2 = [c for c in range(100, 130) if c < 128 and c not in (105, 106)]
    q2_before = [
        c for c in eligible_q2 if D(2011, 3, 1) + dt.timedelta(days=40 * (c - 100)) < D(2012, 1, 1)
    ]
    topic = {c: [1, 10, 2, 20, 99][(c - 100) % 5] for c in range(100, 140)}
    assert sorted(got[("1-11", "shares_query_topic")]) == [c for c in eligible_q1 if topic[c] == 1]
    assert sorted(got[("1-11", "shares_positive_topic")]) == [
        c for c in eligible_q1 if topic[c] == 10
    ]
    other_q1 = got[("1-11", "other")]
    assert other_q1[0] == 103  # the rejected citation heads its group
    assert sorted(other_q1) == sorted([c for c in eligible_q1 if topic[c] in (2, 20, 99)] + [2, 12])
    assert 131 not in other_q1 and 104 in other_q1  # later than q1; failed is no rejection
    assert sorted(got.get(("2-12", "shares_query_topic"), [])) == [
        c for c in q2_before if topic[c] == 2
    ]
    assert sorted(got.get(("2-12", "other"), [])) == sorted(
        c for c in q2_before if topic[c] in (1, 10, 99)
    )
    rej = candidates.filter(pc.equal(candidates["source"], "rejected_citation"))
    assert rej["candidate_id"].to_pylist() == [103]
    assert queries.filter(pc.equal(queries["query_id"], "2-12"))["base_date"].to_pylist() == [
        D(2012, 1, 1)
    ]
    # short groups, but no list was full at top_k: a deeper search could add nothing
    assert m["stats"]["short_groups"] > 0 and m["stats"]["queries_pooled_deeper"] == 0
    assert m["stats"]["universe_shards"] == 3
    assert m["stats"]["poolers"]["splade"]["shards"] == m["stats"]["poolers"]["bm25"]["shards"] == 3
