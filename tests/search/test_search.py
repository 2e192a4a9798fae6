"""`cpr index` / `cpr search` on a small corpus: exact answers, filters, shards, increments, BEIR,
hybrid, the LLM steps through the scripted endpoint, and the command line's two outputs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from cpr_ray.config import load_config
from cpr_ray.errors import ConfigError, InputError, StorageError
from cpr_ray.retrieval import make_retriever
from cpr_ray.retrieval.encoder import DenseEncoder
from cpr_ray.retrieval.spec import EncoderSpec, RetrieverOptions
from cpr_ray.search.engine import Query, SearchIndex, SearchOptions, majority_field, merge_top_k
from cpr_ray.search.run import read_queries, run_search
from cpr_ray.search.sharded_index import build_index
from cpr_ray.storage.store import Storage
from tests.runs.test_cli import error_line
from tests.search_corpus import FIELDS, papers, write_export
from tests.standins.launch import CPR

N = 300
QUERIES = [
    Query("q1", "How to train a neural network classifier on a graph dataset?"),
    Query("q2", "How do protein folding and gene expression interact?"),
    Query("q3", "How to price an auction in a labor market?"),
    Query("q4", "How does entropy govern diffusion towards equilibrium?"),
]


def config(tmp: Path, minilm: str, corpus: Path | str, out: Path | str, **keys):
    flags = {
        "search.corpus": str(corpus),
        "search.out": str(out),
        "search.index": str(out),
        "encoder.model": minilm,
        "eval.llm_root": str(tmp / "llm"),
        **keys,
    }
    return load_config(flags=flags)


def texts_of(rows: list[dict]) -> list[str]:
    """The one paper text of each row: "title. abstract" (these titles end in no full stop)."""
    return [f"{r['title']}. {r['abstract']}" if r["abstract"] else r["title"] for r in rows]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, list[dict]]:
    rows = papers(N)
    return write_export(tmp_path_factory.mktemp("export"), rows), rows


@pytest.fixture(scope="module")
def built(corpus, minilm, ray_session, tmp_path_factory):
    """One index with BM25 beside it, and the exact vectors to check it against."""
    export, rows = corpus
    tmp = tmp_path_factory.mktemp("index")
    cfg = config(tmp, minilm, export, tmp / "idx")
    manifest = build_index(cfg)
    # `cpr eval --retriever hybrid`'s retriever over the same papers (corpus-id order, as the
    # cpr-full loader reads them): its dense side's vectors are the exact ones
    hybrid = make_retriever("hybrid", minilm, RetrieverOptions.from_config(cfg))
    hybrid.index(texts_of(sorted(rows, key=lambda r: r["corpus_id"])))
    assert [r["corpus_id"] for r in rows] == sorted(r["corpus_id"] for r in rows)
    return cfg, manifest, rows, hybrid.dense.docs, hybrid.dense.encoder, hybrid


def exact(docs, q, k, allowed=None):
    scores = q @ docs.T
    if allowed is not None:
        scores = np.where(allowed[None, :], scores, -np.inf)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(scores, order, 1)


def assert_same_ranking(ids, scores, want_ids, want_scores):
    """Same ids in the same order, except where two scores tie to float precision."""
    np.testing.assert_allclose(scores, want_scores, atol=1e-5)
    for got, want, s in zip(ids, want_ids, want_scores):
        for i, (a, b) in enumerate(zip(got, want)):
            if a != b:
                near = [abs(s[i] - s[j]) < 1e-5 for j in (i - 1, i + 1) if 0 <= j < len(s)]
                assert any(near), (got, want)


def test_index_answers_as_exact_search_with_metadata(built):
    cfg, manifest, rows, docs, enc, _ = built
    assert manifest["n_docs"] == N and len(manifest["shards"]) == 1
    assert manifest["build"] == {**manifest["build"], "encoded": N, "reused": 0, "deleted": 0}
    index = SearchIndex.load(Storage(cfg.storage), cfg.search.index)
    results = index.search(QUERIES, SearchOptions(retriever="dense", k=10))
    q = enc.encode_queries([x.query for x in QUERIES])
    order, want = exact(docs, q, 10)
    ids = [[h["corpus_id"] for h in r["hits"]] for r in results]
    scores = np.array([[h["score"] for h in r["hits"]] for r in results])
    assert_same_ranking(ids, scores, [[rows[i]["corpus_id"] for i in o] for o in order], want)
    by_id = {r["corpus_id"]: r for r in rows}
    for result in results:
        for n, h in enumerate(result["hits"], start=1):
            paper = by_id[h["corpus_id"]]
            assert h["rank"] == n
            assert (h["title"], h["year"], h["field"], h["domain"]) == (
                paper["title"],
                paper["year"],
                paper["field"],
                paper["domain"],
            )
    # the nearest papers of a biology question are biology papers
    assert results[1]["hits"][0]["field"].startswith("Biochemistry")


def test_trust_remote_code_is_the_searchers_setting_not_the_indexs(built):
    """encoder.trust_remote_code reaches the query encoder from the searcher's config (`cpr
    search`, `cpr serve`): an index records no such setting, so reading one runs no model code
    its reader has not allowed, and setting it never makes a rebuild re-encode."""
    cfg, manifest, *_ = built
    assert "trust_remote_code" not in manifest["encoder"]
    storage = Storage(cfg.storage)
    assert not SearchIndex.load(storage, cfg.search.index).spec.trust_remote_code
    trusted = SearchIndex.load(
        storage, cfg.search.index, EncoderSpec(model="", trust_remote_code=True)
    )
    assert trusted.spec.trust_remote_code


def test_filters_run_inside_the_search(built):
    cfg, _, rows, docs, enc, _ = built
    index = SearchIndex.load(Storage(cfg.storage), cfg.search.index)
    fields = np.array([r["field"] for r in rows])
    years = np.array([r["year"] for r in rows])
    q = enc.encode_queries([x.query for x in QUERIES])
    cs = "Computer Science"

    # the query's own field given: no hit from it, k hits, exactly the filtered exact search
    res = index.search(
        QUERIES, SearchOptions(retriever="dense", k=25, other_fields_only=True, field=cs)
    )
    order, want = exact(docs, q, 25, fields != cs)
    for r, o, w in zip(res, order, want):
        assert len(r["hits"]) == 25 and all(h["field"] != cs for h in r["hits"])
        assert (r["query_field"], r["query_field_source"]) == (cs, "given")
        assert_same_ranking(
            [[h["corpus_id"] for h in r["hits"]]],
            np.array([[h["score"] for h in r["hits"]]]),
            [[rows[i]["corpus_id"] for i in o]],
            w[None],
        )

    # inferred: the majority field of the 20 nearest papers, and never returned
    res = index.search(
        QUERIES, SearchOptions(retriever="dense", k=10, other_fields_only=True, infer_field_k=20)
    )
    near, near_scores = exact(docs, q, 20)
    for r, o, s in zip(res, near, near_scores):
        own = majority_field([rows[i]["field"] for i in o], s)
        assert (r["query_field"], r["query_field_source"]) == (own, "inferred")
        assert len(r["hits"]) == 10 and all(h["field"] != own for h in r["hits"])
    assert res[0]["query_field"] == cs and res[2]["query_field"].startswith("Economics")

    # excluded fields and a date: all three filters at once, k hits still
    excluded = ("Physics and Astronomy", "Economics, Econometrics and Finance")
    res = index.search(
        QUERIES, SearchOptions(retriever="dense", k=30, exclude_fields=excluded, before=2005)
    )
    allowed = ~np.isin(fields, excluded) & (years < 2005)
    assert allowed.sum() > 30
    for r in res:
        assert len(r["hits"]) == 30
        assert all(h["field"] not in excluded and h["year"] < 2005 for h in r["hits"])

    # fewer than k pass: all of them, nothing else
    res = index.search(QUERIES[:1], SearchOptions(retriever="dense", k=100, before=1991))
    assert (years < 1991).sum() < 100
    assert sorted(h["corpus_id"] for h in res[0]["hits"]) == sorted(
        rows[i]["corpus_id"] for i in np.flatnonzero(years < 1991)
    )


def test_sharded_index_on_s3_answers_as_one_shard(built, s3_endpoint, s3_bucket):
    """The same documents and vectors published as 5 shards on S3 and loaded back from there."""
    from cpr_ray.search.sharded_index import publish

    cfg, manifest, *_ = built
    one = SearchIndex.load(Storage(cfg.storage), cfg.search.index)
    out = f"s3://{s3_bucket}/index"
    s3 = Storage(cfg.storage.model_copy(update={"s3_endpoint": s3_endpoint}))
    vectors = np.concatenate([s.vectors for s in one.shards])
    search = cfg.search.model_copy(update={"shard_size": 64})
    extra = {k: manifest[k] for k in ("encoder", "source")}
    published = publish(s3, out, one.docs, vectors, search, generation=1, build={}, **extra)
    assert len(published["shards"]) == -(-N // 64)
    many = SearchIndex.load(s3, out)
    opts = SearchOptions(retriever="dense", k=40, exclude_fields=("Computer Science",), before=2015)
    for a, b in zip(one.search(QUERIES, opts), many.search(QUERIES, opts)):
        assert [h["corpus_id"] for h in a["hits"]] == [h["corpus_id"] for h in b["hits"]]
        np.testing.assert_allclose(
            [h["score"] for h in a["hits"]], [h["score"] for h in b["hits"]], atol=1e-6
        )
    # the hybrid index's BM25 files went to S3 too (hybrid: the default where both sides are)
    hybrid = SearchOptions(k=5)
    assert [h["corpus_id"] for h in one.search(QUERIES, hybrid)[0]["hits"]] == [
        h["corpus_id"] for h in many.search(QUERIES, hybrid)[0]["hits"]
    ]


def test_reindex_encodes_only_what_changed(
    corpus, minilm, ray_session, tmp_path, s3_endpoint, s3_bucket, monkeypatch
):
    """On S3, in shards of 50 written 16 vectors at a time: the encoder actors' parts and the
    kept vectors (read back by row group from the previous shards) are assembled a chunk at a
    time into shards that answer as exact search does."""
    import cpr_ray.search.sharded_index as search_index

    monkeypatch.setattr(search_index, "CHUNK_ROWS", 16)
    _, rows = corpus
    out = f"s3://{s3_bucket}/idx"
    on_s3 = {"storage.s3_endpoint": s3_endpoint, "search.shard_size": 50, "search.bm25": False}
    export = write_export(tmp_path / "v1", rows[:120])
    cfg = config(tmp_path, minilm, export, out, **on_s3)
    storage = Storage(cfg.storage)
    first = build_index(cfg)
    assert first["build"]["encoded"] == 120
    assert [s["rows"] for s in first["shards"]] == [50, 50, 20]
    shard = storage.parquet_file(f"{out}/{first['shards'][0]['path']}/vectors.parquet")
    assert shard.metadata.num_rows == 50 and shard.metadata.num_row_groups == 4  # 16 at a time
    assert not storage.exists(f"{out}/g0001/encoded")  # the parts are gone once in the shards
    # a refresh: 3 papers changed, 5 deleted, 4 new
    changed = [dict(r) for r in rows[:120]]
    for r in changed[:3]:
        r["abstract"] = "We now study quantum entropy and galaxy diffusion instead."
    changed = changed[:115] + papers(4, seed=9, start_id=10**6)
    export2 = write_export(tmp_path / "v2", changed)
    second = build_index(config(tmp_path, minilm, export2, out, **on_s3))
    assert second["build"] == {
        **second["build"],
        "reason": "same encoder",
        "encoded": 7,
        "reused": 112,
        "deleted": 5,
    }
    assert second["generation"] == 2
    assert storage.list_dirs(out) == [f"{out}/g0002"]
    assert storage.list_dirs(f"{out}/g0002") == [f"{out}/g0002/shard-0000{i}" for i in range(3)]
    # the updated index answers as a fresh one of the new corpus
    index = SearchIndex.load(storage, out)
    enc = DenseEncoder(EncoderSpec(model=minilm))
    docs = enc.encode_docs(texts_of(changed))
    q = enc.encode_queries([x.query for x in QUERIES])
    order, want = exact(docs, q, 15)
    res = index.search(QUERIES, SearchOptions(retriever="dense", k=15))
    assert_same_ranking(
        [[h["corpus_id"] for h in r["hits"]] for r in res],
        np.array([[h["score"] for h in r["hits"]] for r in res]),
        [[changed[i]["corpus_id"] for i in o] for o in order],
        want,
    )
    # another model: everything is encoded again
    third = build_index(
        config(tmp_path, minilm, export2, out, **on_s3, **{"encoder.max_length": 64})
    )
    assert third["build"]["reason"] == "encoder changed" and third["build"]["encoded"] == 119


def test_stored_vectors_hold_only_the_pieces_a_run_needs(tmp_path):
    """A re-index's vectors: kept ones from the previous shard's row groups, re-encoded ones
    from the encoder actors' parts (the previous shard's stale vector of a changed text is not
    taken). Each run of rows gets exactly its vectors while holding only pieces it overlaps;
    a vector in no piece is one clear error."""
    import pyarrow as pa

    from cpr_ray.retrieval.faiss_index import save_vector_chunks
    from cpr_ray.search.sharded_index import Piece, StoredVectors, shard_pieces

    storage = Storage(load_config().storage)
    rng = np.random.default_rng(0)
    vids = np.arange(0, 400, 2, dtype=np.int64)
    want = rng.standard_normal((200, 8)).astype(np.float32)
    kept = rng.random(200) < 0.5
    stale = np.where(kept[:, None], want, -want)
    runs = ((vids[a : a + 32], stale[a : a + 32]) for a in range(0, 200, 32))
    save_vector_chunks(storage, str(tmp_path / "old"), runs, 8)
    old = shard_pieces(storage, str(tmp_path / "old" / "vectors.parquet"))
    assert [(p.lo, p.hi) for p in old[:2]] == [(0, 62), (64, 126)] and len(old) == 7
    new = []
    todo = np.flatnonzero(~kept)
    for a in range(0, len(todo), 10):
        rows = todo[a : a + 10]
        uri = str(tmp_path / "parts" / f"part-{a}.parquet")
        embedding = pa.FixedSizeListArray.from_arrays(pa.array(want[rows].reshape(-1)), 8)
        storage.write_parquet(pa.table({"id": vids[rows], "embedding": embedding}), uri)
        new.append(Piece(uri, int(vids[rows[0]]), int(vids[rows[-1]])))
    vectors = StoredVectors(storage, vids, kept, old, new, 8)
    for a in range(0, 200, 25):
        np.testing.assert_array_equal(vectors.rows(a, a + 25), want[a : a + 25])
        assert vectors.held and all(p.hi >= vids[a] and p.lo <= vids[a + 24] for p in vectors.held)
    lost = StoredVectors(storage, vids, kept, old, new[1:], 8)
    with pytest.raises(StorageError, match="in no stored part"):
        lost.rows(0, 25)


def test_beir_corpus_keeps_its_ids_and_evaluation_vectors(minilm, ray_session, tmp_path):
    from cpr_ray.evaluate.loaders.beir import load_beir

    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    docs = [
        {"_id": f"doc-{i}", "title": r["title"], "text": r["abstract"] or ""}
        for i, r in enumerate(papers(60, seed=3))
    ]
    (beir / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    asked = {"x": "protein folding", "y": "auction prices in markets", "z": "graph networks"}
    (beir / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": i, "text": t}) + "\n" for i, t in asked.items())
    )
    (beir / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{i}\tdoc-{n}\t1\n" for n, i in enumerate(asked))
    )
    cfg = config(tmp_path, minilm, beir / "corpus.jsonl", tmp_path / "idx")
    manifest = build_index(cfg)
    assert manifest["id_type"] == "string" and not manifest["has_fields"]
    index = SearchIndex.load(Storage(cfg.storage), str(tmp_path / "idx"))
    res = index.search([Query("x", "protein folding")], SearchOptions(k=5))
    assert all(h["corpus_id"].startswith("doc-") for h in res[0]["hits"])
    # the vectors `cpr eval --benchmark beir` ranks with
    bench = load_beir(Storage(cfg.storage), str(beir))
    hybrid = make_retriever("hybrid", minilm)  # `cpr eval --retriever hybrid`'s
    hybrid.index(bench.doc_texts)
    want = hybrid.dense.docs
    got = np.concatenate([s.vectors for s in index.shards])
    order = [index.row_of(d) for d in bench.doc_ids]
    np.testing.assert_allclose(got[order], want, atol=1e-5)
    with pytest.raises(InputError, match="no fields"):
        index.search([Query("x", "y")], SearchOptions(other_fields_only=True))
    # `cpr eval --benchmark beir --retriever hybrid`: the same top 10 as the search
    from cpr_ray.evaluate.eval_run import rank

    evaluated = [[bench.doc_ids[p] for p in r[:10]] for r in rank(bench, hybrid, bench.queries)]
    searched = index.search([Query(i, asked[i]) for i in bench.query_ids], SearchOptions(k=10))
    assert evaluated == [[h["corpus_id"] for h in r["hits"]] for r in searched]
    # an index built before BM25 was the default (its manifest names none) still searches
    old = tmp_path / "old-idx"
    shutil.copytree(tmp_path / "idx", old)
    manifest = json.loads((old / "index.json").read_text())
    (old / "index.json").write_text(json.dumps({**manifest, "bm25": None}))
    before = SearchIndex.load(Storage(cfg.storage), str(old))
    assert "running cpr index again" in before.notice
    plain = before.search([Query("x", "protein folding")], SearchOptions(k=5))[0]
    assert plain["retriever"] == "dense" and plain["hits"][0]["bm25_rank"] is None
    with pytest.raises(ConfigError, match="built without it"):
        before.search([Query("x", "y")], SearchOptions(retriever="bm25"))
    with pytest.raises(StorageError, match="no search index"):
        SearchIndex.load(Storage(cfg.storage), str(tmp_path / "nothing"))


def test_hybrid_by_default_each_hit_with_its_rank_on_each_side(built):
    cfg, _, rows, *_ = built
    index = SearchIndex.load(Storage(cfg.storage), cfg.search.index)
    # "setting 123" is in one abstract only: BM25 finds it, dense alone does not rank it first
    target = next(r for r in rows if r["abstract"] and "setting 123." in r["abstract"])
    query = [Query("h", "What happens in setting 123?")]
    result = index.search(query, SearchOptions(k=10))[0]  # an index with both sides: fused
    hybrid = result["hits"]
    assert result["retriever"] == "hybrid"
    assert result["fusion"] == {"method": "rrf", "k": 60, "depth": 100}
    assert len(hybrid) == 10 and target["corpus_id"] in [h["corpus_id"] for h in hybrid[:3]]
    assert hybrid[0]["score"] <= 2 / 61 + 1e-6  # reciprocal rank fusion scores (6 decimals)
    # each hit's ranks are its ranks in the one-side searches, and its score their RRF
    sides = {
        side: [
            h["corpus_id"]
            for h in index.search(query, SearchOptions(k=100, retriever=side))[0]["hits"]
        ]
        for side in ("dense", "bm25")
    }
    assert sides["bm25"][0] == target["corpus_id"] and sides["dense"][0] != target["corpus_id"]
    for h in hybrid:
        ranks = {
            s: sides[s].index(h["corpus_id"]) + 1 if h["corpus_id"] in sides[s] else None
            for s in sides
        }
        assert (h["dense_rank"], h["bm25_rank"]) == (ranks["dense"], ranks["bm25"])
        want = sum(1 / (60 + r) for r in ranks.values() if r is not None)
        assert h["score"] == pytest.approx(want, abs=1e-6)
    dense = index.search(query, SearchOptions(k=10, retriever="dense"))[0]
    assert dense["fusion"] is None
    assert [(h["dense_rank"], h["bm25_rank"]) for h in dense["hits"]] == [
        (n, None) for n in range(1, 11)
    ]


def test_a_paper_filtered_or_excluded_on_one_side_never_returns_through_the_other(built):
    """BM25 ranks the target first and dense ranks it too: a filter that drops it (its year,
    its field, the query's own field) or the query naming it as its own paper keeps it out of
    the fused hits, and each side's ranks are those of that side's filtered search."""
    cfg, _, rows, *_ = built
    index = SearchIndex.load(Storage(cfg.storage), cfg.search.index)
    target = next(r for r in rows if r["abstract"] and "setting 123." in r["abstract"])
    text = "What happens in setting 123?"
    tid = target["corpus_id"]
    for opts in (
        SearchOptions(k=10, before=target["year"]),
        SearchOptions(k=10, exclude_fields=(target["field"],)),
        SearchOptions(k=10, other_fields_only=True, field=target["field"]),
    ):
        got = index.search([Query("h", text)], opts)[0]["hits"]
        assert len(got) == 10 and tid not in [h["corpus_id"] for h in got]
        for side in ("dense", "bm25"):
            alone = index.search([Query("h", text)], replace(opts, k=100, retriever=side))
            ids = [h["corpus_id"] for h in alone[0]["hits"]]
            for h in got:
                rank = h[f"{side}_rank"]
                assert rank is None or ids[rank - 1] == h["corpus_id"]
    for side in ("hybrid", "dense", "bm25"):
        own = index.search([Query("h", text, (tid,))], SearchOptions(k=10, retriever=side))
        assert len(own[0]["hits"]) == 10 and tid not in [h["corpus_id"] for h in own[0]["hits"]]
        assert own[0]["excluded_ids"] == [tid]
    # excluded before each side's cut (an id given as text too): a hit's rank on a side is its
    # rank in that side's search without the paper, as a filter dropping it would give
    q = Query("h", text, (str(tid),))
    fused = index.search([q], SearchOptions(k=10))[0]["hits"]
    assert tid not in [h["corpus_id"] for h in fused]
    for side in ("dense", "bm25"):
        alone = index.search([q], SearchOptions(k=100, retriever=side))[0]["hits"]
        ids = [h["corpus_id"] for h in alone]
        assert all(ids[h[f"{side}_rank"] - 1] == h["corpus_id"] for h in fused if h[f"{side}_rank"])


def test_eval_hybrid_equals_search_on_the_whole_corpus(built, tmp_path):
    """`cpr eval --benchmark cpr-full --retriever hybrid` and `cpr search` on an index of the
    same export: the same top 10 per query (each query's own paper left out by both), for RRF
    and for the convex sum."""

    import pyarrow as pa
    import pyarrow.parquet as pq

    from cpr_ray.evaluate.eval_run import rank
    from cpr_ray.evaluate.loaders.cpr_eval import load_cpr
    from cpr_ray.retrieval.fusion import Fusion

    cfg, _, rows, _, _, retriever = built
    export = tmp_path / "export"
    shutil.copytree(cfg.search.corpus, export)
    picks = [rows[i] for i in (3, 50, 120, 200, 260)]
    base = [rows[i]["corpus_id"] for i in (4, 51, 121, 201, 261)]
    texts = [f"How can {p['title'].lower()} help?" for p in picks]
    table = {
        "query_id": [f"q{i}" for i in range(5)],
        "query": texts,
        "base_corpus_id": base,
        "positive_id": [p["corpus_id"] for p in picks],
        "candidate_ids": [[p["corpus_id"]] for p in picks],
        "candidate_groups": [["positive"]] * 5,
        "field": [p["field"] for p in picks],
        "domain": [p["domain"] for p in picks],
    }
    pq.write_table(pa.table(table), export / "cpr-eval.parquet")
    bench = load_cpr(Storage(cfg.storage), str(export), full=True)
    index = SearchIndex.load(Storage(cfg.storage), cfg.search.index)
    assert bench.doc_texts == texts_of(rows)  # the papers the fixture indexed, in its order
    queries = [Query(f"q{i}", t, (b,)) for i, (t, b) in enumerate(zip(texts, base))]
    for fusion in (Fusion(), Fusion(method="convex", weight=0.3, depth=50)):
        retriever.fusion = fusion
        ranked = rank(bench, retriever, bench.queries, top_k=fusion.depth)
        evaluated = [[int(bench.doc_ids[p]) for p in r[:10]] for r in ranked]
        searched = [
            [h["corpus_id"] for h in r["hits"]]
            for r in index.search(queries, SearchOptions(k=10, fusion=fusion))
        ]
        assert evaluated == searched
        assert not any(b in hits for b, hits in zip(base, searched))


def test_rerank_and_explain_through_the_llm_layer(built, llm):
    cfg, *_ = built
    cfg = cfg.model_copy(
        update={
            "llm": cfg.llm.model_copy(
                update={"base_url": llm.base_url, "model": "scripted", "actors": 1}
            ),
            "search": cfg.search.model_copy(update={"rerank_depth": 12}),
        }
    )
    index = SearchIndex.load(Storage(cfg.storage), cfg.search.index)
    opts = SearchOptions(k=3, other_fields_only=True)
    results = run_search(index, QUERIES[:2], opts, cfg, rerank=True, explain=True)
    for r in results:
        assert r["reranked"] == "llm-tournament" and len(r["hits"]) == 3
        assert [h["rank"] for h in r["hits"]] == [1, 2, 3]
        assert all(h["field"] != r["query_field"] for h in r["hits"])
        for h in r["hits"]:
            exp = h["explanation"]
            assert exp is not None and exp["decision"] in (
                "observed_analogy",
                "potential_analogy",
                "not_analogy",
            )
            assert {"object_mappings", "shared_relations", "transfer_path"} <= set(exp)
    asked = llm.stats()
    again = run_search(index, QUERIES[:2], opts, cfg, rerank=True, explain=True)
    assert llm.stats() == asked  # the cache answers a repeated search
    assert [h["corpus_id"] for h in again[0]["hits"]] == [
        h["corpus_id"] for h in results[0]["hits"]
    ]


def test_query_files_and_merge_helpers():
    assert read_queries("How to a?\n\nHow to b?\n", "f") == [
        Query("q1", "How to a?"),
        Query("q3", "How to b?"),
    ]
    jsonl = '{"query_id": "a", "query": "x"}\n{"query_id": "b", "query": "y"}\n'
    assert [q.query_id for q in read_queries(jsonl, "f")] == ["a", "b"]
    with pytest.raises(InputError, match="line 1 has no"):
        read_queries('{"query_id": "a"}\n', "f")
    with pytest.raises(InputError, match="not unique"):
        read_queries('{"query_id": "a", "query": "x"}\n{"query_id": "a", "query": "y"}', "f")
    own = read_queries('{"query": "x", "excluded_ids": [12, "doc-3"]}', "f")
    assert own[0].excluded_ids == (12, "doc-3")
    for bad in ('"12"', "[[12]]", "[{}]", "[true]"):
        with pytest.raises(InputError, match='line 1: "excluded_ids" must be a list of ids'):
            read_queries(f'{{"query": "x", "excluded_ids": {bad}}}', "f")
    rows, scores = merge_top_k(
        [np.array([[1, 2, -1]]), np.array([[7, 8, 9]])],
        [np.array([[0.9, 0.5, 0.0]]), np.array([[0.7, 0.6, 0.1]])],
        4,
    )
    assert rows.tolist() == [[1, 7, 8, 2]]
    assert majority_field(["a", "b", "b", None], [1.0, 0.1, 0.1, 5.0]) == "b"
    assert majority_field(["a", "b"], [0.2, 0.9]) == "b"  # a tie goes to the larger score sum
    assert set(FIELDS) == {
        "Computer Science",
        "Physics and Astronomy",
        "Biochemistry, Genetics and Molecular Biology",
        "Economics, Econometrics and Finance",
    }


def test_cli_json_lines_on_stdout_progress_on_stderr(built, tmp_path):
    cfg, *_ = built
    # q1's best paper in process, named as its own paper in the file: never in its hits
    index = SearchIndex.load(Storage(cfg.storage), cfg.search.index)
    opts = SearchOptions(k=7, other_fields_only=True, before=2010)
    own = index.search(QUERIES[:1], opts)[0]["hits"][0]["corpus_id"]
    queries = tmp_path / "q.jsonl"
    queries.write_text(
        "\n".join(
            json.dumps({"query_id": q.query_id, "query": q.query, "excluded_ids": [own] * (n == 0)})
            for n, q in enumerate(QUERIES)
        )
    )
    proc = subprocess.run(
        [
            *CPR,
            "search",
            str(cfg.search.index),
            "--queries",
            str(queries),
            "--json",
            "-k",
            "7",
            "--other-fields-only",
            "--before",
            "2010",
            "--set",
            f"eval.llm_root={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Loading weights" not in proc.stderr  # transformers' bar, at every call, says nothing
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["query_id"] for r in lines] == [q.query_id for q in QUERIES]
    for r in lines:
        assert r["query_field_source"] == "inferred" and len(r["hits"]) == 7
        assert {"corpus_id", "score", "title", "field", "year"} <= set(r["hits"][0])
        assert all(h["year"] < 2010 and h["field"] != r["query_field"] for h in r["hits"])
        assert r["retriever"] == "hybrid" and r["fusion"]["method"] == "rrf"
        assert all(h["dense_rank"] or h["bm25_rank"] for h in r["hits"])
    assert own not in [h["corpus_id"] for h in lines[0]["hits"]]
    assert lines[0]["excluded_ids"] == [own] and lines[1]["excluded_ids"] == []
    # the table shows each hit's rank on each side, "–" where it was not in that side's depth
    from cpr_ray.runs.command_options import console
    from cpr_ray.search.search_commands import print_result

    with console.capture() as shown:
        print_result(lines[0])
    table = shown.get()
    assert "hybrid rrf k=60, depth 100" in table and "dense" in table and "bm25" in table
    first = lines[0]["hits"][0]
    cells = [str(first["dense_rank"] or "–"), str(first["bm25_rank"] or "–")]
    assert re.search(r"│\s*1\s*│\s*[\d.]+\s*│\s*" + r"\s*│\s*".join(cells) + r"\s*│", table), table


@pytest.mark.parametrize(
    ("query", "k", "message"),
    [
        ("", "3", "query q1 is empty"),
        ("   ", "3", "query q1 is empty"),
        ("How to fold a protein?", "0", "k 0: hits per query go from 1 to search.max_k (1000)"),
        ("How to fold a protein?", "1001", "k 1001: hits per query go from 1 to search.max_k"),
    ],
)
def test_cli_refuses_a_blank_query_and_k_out_of_range_in_one_line(built, query, k, message):
    """Over a real index, so only the check stands between them and ranked papers; the service
    refuses them with the same check, in the same words (test_search_service.py)."""
    from typer.testing import CliRunner

    from cpr_ray.cpr_command import app

    cfg = built[0]
    bad = CliRunner().invoke(app, ["search", str(cfg.search.index), query, "-k", k])
    assert message in error_line(bad)


def test_ivf_shards_filter_inside_faiss_and_never_run_short(built, tmp_path):
    """IVF shards (faiss with the mask as a selector): all lists probed it answers as the exact
    index; one list probed, a filtered search still returns k hits, all passing the filter."""
    from cpr_ray.search.sharded_index import publish

    cfg, manifest, *_ = built
    storage = Storage(cfg.storage)
    exact_index = SearchIndex.load(storage, cfg.search.index)
    vectors = np.concatenate([s.vectors for s in exact_index.shards])
    opts = SearchOptions(k=20, other_fields_only=True, before=2000)
    want = exact_index.search(QUERIES, opts)
    for nprobe, out in ((1000, tmp_path / "all"), (1, tmp_path / "one")):
        search = cfg.search.model_copy(
            update={"shard_size": 200, "ivf_min_vectors": 100, "nprobe": nprobe}
        )
        extra = {k: manifest[k] for k in ("encoder", "source")}
        publish(
            storage, str(out), exact_index.docs, vectors, search, generation=1, build={}, **extra
        )
        ivf = SearchIndex.load(storage, str(out))
        assert not ivf.exact and all(s.factory.startswith("IVF") for s in ivf.shards)
        got = ivf.search(QUERIES, opts)
        for g, w in zip(got, want):
            assert g["query_field"] == w["query_field"]
            assert len(g["hits"]) == 20
            assert all(h["year"] < 2000 and h["field"] != g["query_field"] for h in g["hits"])
            if nprobe == 1000:
                assert [h["corpus_id"] for h in g["hits"]] == [h["corpus_id"] for h in w["hits"]]


def test_the_builds_lance_papers_table_indexes_like_its_export(
    corpus, minilm, ray_session, tmp_path
):
    """The build's papers table (a Lance dataset, found from the build root's ingest manifest)
    gives the same documents and vectors as an export of the same papers."""
    import lance
    import pyarrow as pa

    from cpr_ray.dataset.format import CORPUS

    _, rows = corpus
    papers = pa.Table.from_pylist(rows[:40], schema=CORPUS)
    lance.write_dataset(papers, str(tmp_path / "papers.lance"))
    assert lance.dataset(str(tmp_path / "papers.lance")).version == 1
    papers_uri = str(tmp_path / "papers.lance")
    (tmp_path / "root" / "ingest").mkdir(parents=True)
    (tmp_path / "root" / "ingest" / "_MANIFEST.json").write_text(
        json.dumps({"tables": {"papers": {"uri": papers_uri, "format": "lance", "version": 1}}})
    )
    from_lance = build_index(config(tmp_path, minilm, tmp_path / "root", tmp_path / "a"))
    assert from_lance["source"]["kind"] == "papers" and from_lance["n_docs"] == 40
    from cpr_ray.search.documents import load_documents

    storage = Storage(load_config().storage)
    export = load_documents(storage, str(write_export(tmp_path / "export", rows[:40]))).table
    index = SearchIndex.load(storage, str(tmp_path / "a"))
    got = index.docs.select(["corpus_id", "text", "field"])
    assert got.equals(export.sort_by("corpus_id").select(["corpus_id", "text", "field"]))
    want = DenseEncoder(EncoderSpec(model=minilm)).encode_docs(got["text"].to_pylist())
    np.testing.assert_allclose(index.shards[0].vectors, want, atol=1e-5)


def test_bad_corpora_are_one_clear_error_before_any_work(tmp_path):
    from cpr_ray.search.documents import load_documents

    storage = Storage(load_config().storage)
    with pytest.raises(StorageError, match="does not exist"):
        load_documents(storage, str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(StorageError, match="holds no corpus to index"):
        load_documents(storage, str(tmp_path / "empty"))
    rows = papers(3)
    dup = write_export(tmp_path / "dup", [rows[0], rows[1], {**rows[2], "corpus_id": 1000}])
    with pytest.raises(InputError, match="not unique"):
        load_documents(storage, str(dup))
    (tmp_path / "cols").mkdir()
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(
        pa.table({"corpus_id": [1], "title": ["t"]}), tmp_path / "cols" / "corpus.parquet"
    )
    with pytest.raises(InputError, match="needs column"):
        load_documents(storage, str(tmp_path / "cols"))
    none = write_export(tmp_path / "none", [])
    cfg = load_config(flags={"search.corpus": str(none), "search.out": str(tmp_path / "i")})
    with pytest.raises(InputError, match="no documents"):
        build_index(cfg)
