"""One pooler's per-group ranked lists (no Ray): the date filter inside the search (old queries
are not starved), groups as the topic rule says, faiss (flat and IVF) against exact search, and
the encoder extensions pooling relies on (token-budget batching, last-token pooling with left
padding on a tiny Qwen3, SPLADE's non-negative sparse weights)."""

from __future__ import annotations

import datetime as dt
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from cpr_ray.config import EncoderActors  # noqa: E402
from cpr_ray.pooling.kept_lists import (  # noqa: E402
    losing_queries,
    of_queries,
    unchanged_queries,
    universe_delta,
)
from cpr_ray.pooling.pool_rules import topic_group  # noqa: E402
from cpr_ray.pooling.pool_schemas import GROUPS, SEARCH_QUERIES  # noqa: E402
from cpr_ray.pooling.pooler_search import QueryBatch, Universe, exact_hits, index_hits  # noqa: E402
from cpr_ray.pooling.poolers import PoolerPlan, PoolerSearch  # noqa: E402
from cpr_ray.pooling.universe_shards import (  # noqa: E402
    INDEX_COPIES,
    TASK_BASE,
    UNIVERSE_BYTES,
    index_memory,
    merge_hits,
    shard_count,
    shard_hits,
    shard_of,
)
from cpr_ray.retrieval.base import top_k_rows  # noqa: E402
from cpr_ray.retrieval.bm25 import BM25Retriever, CollectionStats  # noqa: E402
from cpr_ray.retrieval.encoder import (  # noqa: E402
    DenseEncoder,
    Encoder,
    SpladeEncoder,
    batch_bounds,
)
from cpr_ray.retrieval.faiss_index import VectorIndex, factory_for  # noqa: E402
from cpr_ray.retrieval.spec import EncoderSpec  # noqa: E402
from cpr_ray.storage.store import Storage, StorageConfig  # noqa: E402
from tests.retrieval.test_retrieval import tiny_models  # noqa: E402, F401  (the tiny Qwen3 / SPLADE fixture)

EPOCH = dt.date(1970, 1, 1)
N, DIM, TOPICS = 3000, 16, 60


def _date(days: int) -> dt.date:
    return EPOCH + dt.timedelta(days=int(days))


@pytest.fixture(scope="module")
def world():
    """A random universe (ids, days, 0–3 topics each), unit vectors, and 40 queries."""
    rng = np.random.default_rng(0)
    ids = rng.choice(10**9, N, replace=False).astype(np.int64)
    days = rng.integers(10_000, 20_000, N)
    topics = [sorted(rng.choice(TOPICS, rng.integers(0, 4), replace=False).tolist()) for _ in ids]
    docs = pa.table(
        {
            "corpus_id": ids,
            "date_key": pa.array([_date(d) for d in days], pa.date32()),
            "topic_ids": pa.array(topics, pa.list_(pa.int32())),
        }
    )
    c = 40
    base_days = rng.integers(10_000, 20_000, c)
    base_days[0] = 10_150  # an old query: only ~1.5% of the universe precedes it
    queries = pa.Table.from_pydict(
        {
            "query_id": [f"q{i}" for i in range(c)],
            "query": ["q"] * c,
            "base_id": ids[:c],
            "base_date": [_date(d) for d in base_days],
            "positive_id": ids[c : 2 * c],
            "q_topics": [[int(t)] for t in rng.integers(0, TOPICS // 2, c)],
            "p_topics": [[int(t), int(t) + 1] for t in rng.integers(TOPICS // 2, TOPICS - 1, c)],
            "depth": [25] * c,
        },
        schema=SEARCH_QUERIES,
    )
    unit = rng.standard_normal((N + c, DIM)).astype(np.float32)
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    universe = Universe(docs)
    vectors = unit[:N][universe.order]  # in search order
    return {
        "docs": docs,
        "universe": universe,
        "queries": queries,
        "vectors": vectors,
        "qvecs": unit[N:],
        "days": days,
        "topics": dict(zip(ids.tolist(), topics)),
    }


def _entries(hits) -> set[tuple[int, int, int, int]]:
    return set(
        zip(hits.rows.tolist(), hits.groups.tolist(), hits.positions.tolist(), hits.ranks.tolist())
    )


def test_lists_hold_only_eligible_papers_of_their_group_and_old_queries_are_not_starved(world):
    u, q = world["universe"], world["queries"]
    batch = QueryBatch.build(u, q)
    hits = exact_hits(world["qvecs"] @ world["vectors"].T, batch, positive_only=False)
    ids = u.corpus_ids[hits.positions]
    base_days = [(d - EPOCH).days for d in q["base_date"].to_pylist()]
    doc_days = dict(zip(world["docs"]["corpus_id"].to_pylist(), world["days"].tolist()))
    rows = hits.rows.tolist()
    assert all(doc_days[i] < base_days[r] for i, r in zip(ids.tolist(), rows))  # before q
    assert not set(zip(rows, ids.tolist())) & set(enumerate(q["positive_id"].to_pylist()))
    # the group of every entry is the topic rule's
    c_topics = pa.array([world["topics"][i] for i in ids.tolist()], pa.list_(pa.int32()))
    expected = topic_group(c_topics, q["q_topics"].take(hits.rows), q["p_topics"].take(hits.rows))
    assert [GROUPS[g] for g in hits.groups.tolist()] == expected.to_pylist()
    # every list is full unless the group has fewer eligible members: the old query included
    old = hits.rows == 0
    assert batch.cutoff[0] < 0.02 * N
    assert (hits.groups[old] == 2).sum() == 25  # a top-25 over ~45 eligible papers, not 0
    for g in range(2):
        members = int((batch.members[g][0] == 0).sum())
        assert (hits.groups[old] == g).sum() == min(25, members)
    # ranks run 0.. per (query, group), best first
    scores = (world["qvecs"] @ world["vectors"].T)[hits.rows, hits.positions]
    first = (hits.rows == 3) & (hits.groups == 2)
    assert sorted(hits.ranks[first].tolist()) == list(range(first.sum()))
    assert np.all(np.diff(scores[first][np.argsort(hits.ranks[first])]) <= 0)


@pytest.mark.parametrize("factory, nprobe", [("Flat", 1), ("IVF8,Flat", 8)])
def test_faiss_index_search_agrees_with_exact_search(world, factory, nprobe):
    u, batch = world["universe"], QueryBatch.build(world["universe"], world["queries"])
    exact = exact_hits(world["qvecs"] @ world["vectors"].T, batch, positive_only=False)
    index = VectorIndex(u.corpus_ids, world["vectors"], factory, nprobe=nprobe)
    assert _entries(index_hits(index, u, world["qvecs"], batch)) == _entries(exact)


def _lists(table: pa.Table) -> list[tuple]:
    return sorted(
        zip(*(table[c].to_pylist() for c in ("query_id", "group", "candidate_id", "rank")))
    )


BM25_WORDS = [f"{w}{i}" for w in ("lens", "spin", "fold", "graph") for i in range(10)]
BM25_PLAN = PoolerPlan("p", "bm25", "{title} {abstract}", None, EncoderActors(actors=1))


def _bm25_world(world) -> tuple[pa.Table, pa.Table]:
    """The world's papers with texts of 1-6 of 40 words (many papers share a text's counts and
    length, so scores tie) or, for 1 in 30, none BM25 indexes; its queries with 2-5 of those
    words and one no paper has."""
    rng = np.random.default_rng(2)
    n, q = world["docs"].num_rows, world["queries"]
    texts = [" ".join(rng.choice(BM25_WORDS, rng.integers(1, 7))) for _ in range(n)]
    texts[::30] = ["the a of it"] * len(texts[::30])  # stop words and one letter: no term
    docs = world["docs"].append_column("title", pa.array(texts))
    docs = docs.append_column("abstract", pa.array([""] * n))
    words = [rng.choice(BM25_WORDS, rng.integers(2, 6)).tolist() for _ in range(q.num_rows)]
    queries = [" ".join(w + ["quasar"]) for w in words]
    return docs, q.set_column(q.schema.get_field_index("query"), "query", pa.array(queries))


@pytest.mark.parametrize("backend", ["exact", "exact_ties", "Flat", "bm25"])
def test_shards_merged_give_the_lists_of_one_index_over_the_universe(world, backend, tmp_path):
    """The universe cut in 5 shards by `shard_of`, each searched alone as a search actor does
    (its own Universe, cutoffs, groups and index), the lists merged one shard at a time: the
    lists one search over the whole universe gives, ranks and tie-breaking included. Rounded
    scores make ties common, at every list's end too. BM25: each shard searched by the
    pooler's search actor, which indexes it with the universe's statistics (summed over
    other parts, as the tasks writing the shards count them), against bm25s's own index over
    the universe; a sixth shard holds the papers with no term to index."""
    docs, q, unit = world["docs"], world["queries"], world["vectors"]
    vectors = dict(zip(world["universe"].corpus_ids.tolist(), unit))
    if backend == "bm25":
        docs, q = _bm25_world(world)
        bm25, buckets = BM25Retriever(), docs["corpus_id"].to_numpy() % 3
        terms = bm25.terms(q["query"].to_pylist())
        stats = CollectionStats.total(
            bm25.statistics(docs.filter(pa.array(buckets == k))["title"].to_pylist(), terms)
            for k in range(3)
        )
        storage = Storage(StorageConfig())
        collection, shard_docs = str(tmp_path / "collection.json"), str(tmp_path / "shard.parquet")
        storage.write_json(collection, stats.as_dict())

    def search(part: pa.Table) -> pa.Table:
        if backend == "bm25" and part.num_rows < N:  # a shard, as the pooler's actor loads it
            storage.write_parquet(part, shard_docs)
            return PoolerSearch(BM25_PLAN, storage.cfg, shard_docs, collection)(q)
        u = Universe(part)
        batch = QueryBatch.build(u, q)
        if backend == "bm25":  # bm25s's own index over the universe
            bm25.index(part["title"].take(pa.array(u.order)).to_pylist())
            hits = exact_hits(bm25.scores(q["query"].to_pylist()), batch, positive_only=True)
            return shard_hits(q, u, hits, "p")
        vecs = np.stack([vectors[i] for i in u.corpus_ids.tolist()])
        if backend == "Flat":
            hits = index_hits(VectorIndex(u.corpus_ids, vecs), u, world["qvecs"], batch)
        else:
            scores = world["qvecs"] @ vecs.T
            if backend == "exact_ties":
                scores = np.round(np.maximum(scores, 0), 1)  # a few values, zeros dropped
            hits = exact_hits(scores, batch, positive_only=backend == "exact_ties")
        return shard_hits(q, u, hits, "p")

    depths = q.select(["query_id", "depth"])
    whole = merge_hits([search(docs)], depths)
    shard = shard_of(docs["corpus_id"].to_numpy(), 5)
    assert np.bincount(shard).min() > 0.8 * N / 5  # even shards
    if backend == "bm25":
        shard[::30] = 5  # the papers without a term: their shard brings none
        assert search(docs.filter(pa.array(shard == 5))).num_rows == 0
    merged = merge_hits([], depths)
    for s in range(shard.max() + 1):
        merged = merge_hits([merged, search(docs.filter(pa.array(shard == s)))], depths)
    assert len(whole) > 1000 and _lists(merged) == _lists(whole)
    if backend == "exact":  # and the unsharded lists are exact search's own
        u = world["universe"]
        plain = exact_hits(world["qvecs"] @ unit.T, QueryBatch.build(u, q), positive_only=False)
        assert _lists(whole) == _lists(shard_hits(q, u, plain, "p"))


def test_top_k_keeps_the_lowest_columns_of_a_tie_at_the_kth_score():
    scores = np.random.default_rng(1).integers(0, 3, (40, 3000)).astype(np.float32)
    idx, _ = top_k_rows(scores, 25)
    for row, got in zip(scores, idx):
        assert got.tolist() == np.lexsort((np.arange(len(row)), -row))[:25].tolist()


def test_shard_sizes_and_the_memory_a_shard_asks_for():
    assert shard_count(10, 5) == 2 and shard_count(11, 5) == 3 and shard_count(0, 5) == 1
    # 5M papers of a 1024-dim float32 pooler: 20 GB of vectors, held 3 times while loading
    per_paper = INDEX_COPIES * 1024 * 4 + UNIVERSE_BYTES
    assert index_memory(5_000_000, 1024 * 4) == TASK_BASE + 5_000_000 * per_paper
    assert index_memory(0, 4096) == TASK_BASE
    assert index_memory(1000, 4096, base=0) == 1000 * per_paper
    # sequential ids (a key bucket's are ids mod n) spread evenly, and always to the same shard
    ids = np.arange(0, 64 * 10_000, 64)
    counts = np.bincount(shard_of(ids, 7), minlength=7)
    assert counts.min() > 0.9 * len(ids) / 7
    assert (shard_of(ids, 7) == shard_of(ids.copy(), 7)).all()


def test_sparse_scores_retrieve_only_papers_scoring_above_zero(world):
    batch = QueryBatch.build(world["universe"], world["queries"])
    scores = np.maximum(world["qvecs"] @ world["vectors"].T, 0)  # about half are zero
    hits = exact_hits(scores, batch, positive_only=True)

    def lists(h) -> dict[tuple[int, int], list[int]]:
        order = np.lexsort((h.ranks, h.groups, h.rows))
        out: dict[tuple[int, int], list[int]] = {}
        for i in order:
            out.setdefault((int(h.rows[i]), int(h.groups[i])), []).append(int(h.positions[i]))
        return out

    # by brute force: per query and group, the eligible papers scoring above zero, best first,
    # equal scores to the lower position, `depth` of them
    expected: dict[tuple[int, int], list[int]] = {}
    for q in range(len(batch)):
        eligible = {g: batch.members[g][1][batch.members[g][0] == q] for g in (0, 1)}
        others = np.setdiff1d(np.arange(batch.cutoff[q]), np.concatenate(list(eligible.values())))
        eligible[2] = others[others != batch.excluded[q]]
        for g, cols in eligible.items():
            best = sorted(
                (c for c in cols.tolist() if scores[q, c] > 0), key=lambda c: (-scores[q, c], c)
            )
            if best:
                expected[(q, g)] = best[: batch.depth[q]]
    assert lists(hits) == expected and len(expected) > len(batch)  # most queries, several groups


def test_ivf_above_the_threshold():
    assert factory_for(999, 1000) == "Flat"
    assert factory_for(1_000_000, 1000) == "IVF4000,Flat"  # 4·√n
    assert factory_for(2000, 1000) == "IVF51,Flat"  # capped: >= 39 training points per list
    assert factory_for(2000, 1000, lists=8) == "IVF8,Flat"


# -- encoder extensions -----------------------------------------------------------------------
def test_token_budget_batches():
    lengths = np.array([300, 200, 100, 100, 50, 50, 50, 10])
    assert batch_bounds(lengths, 4, None) == [(0, 4), (4, 8)]
    # 600 padded tokens: 2 of 300, then 4 of <= 100 (cap 4), then the rest
    assert batch_bounds(lengths, 4, 600) == [(0, 2), (2, 6), (6, 8)]
    assert batch_bounds(np.array([900, 10]), 4, 600) == [(0, 1), (1, 2)]  # too long: alone


def test_token_budget_batching_gives_the_same_embeddings(minilm):
    texts = [("word " * n).strip() for n in (3, 150, 40, 7, 90, 1, 60)]
    plain = DenseEncoder(EncoderSpec(model=minilm, batch_size=3)).encode_docs(texts)
    budget = DenseEncoder(EncoderSpec(model=minilm, batch_size=64, token_budget=200)).encode_docs(
        texts
    )
    np.testing.assert_allclose(plain, budget, atol=1e-5)


def test_last_token_pooling_with_left_padding_matches_a_hand_computation(tiny_models):  # noqa: F811
    enc = DenseEncoder(EncoderSpec(model=tiny_models["qwen"], batch_size=8))
    assert enc.spec.pooling == "last_token"
    enc.model.tokenizer.padding_side = "left"  # as Qwen3-Embedding's own tokenizer pads
    texts = ["short", "a much longer text with quite a few more words in it", "mid length one"]
    got = enc.encode_docs(texts)
    backbone, tok = enc.model.backbone, enc.model.tokenizer
    with torch.inference_mode():
        for text, vec in zip(texts, got):
            ids = tok(text, return_tensors="pt")  # alone: no padding at all
            last = backbone(**ids).last_hidden_state[0, -1]  # (d,) the last real token's state
            np.testing.assert_allclose(vec, (last / last.norm()).numpy(), atol=1e-5)


def test_splade_weights_are_non_negative_and_sparse(tiny_models):  # noqa: F811
    enc = SpladeEncoder(EncoderSpec(model=tiny_models["splade"], batch_size=2))
    texts = ["quantum photon pairs", "cats on a mat in the sun", "x"]
    weights = enc.encode_docs(texts)  # CSR (3, V)
    assert weights.format == "csr" and weights.shape == (3, enc.dim)
    assert (weights.data > 0).all()  # stored entries are the nonzeros, all positive
    assert (weights.getnnz(axis=1) < enc.dim).all()
    model = Encoder.load(tiny_models["splade"], "splade")
    with torch.inference_mode():
        for i, text in enumerate(texts):
            logits = model.backbone(**model.tokenize([text])).logits[0]  # (L, V)
            hand = torch.log1p(torch.relu(logits)).max(dim=0).values.numpy()
            np.testing.assert_allclose(weights[i].toarray()[0], hand, atol=1e-5)


@pytest.mark.parametrize("backend", ["Flat", "exact_ties"])
def test_kept_lists_merged_with_the_added_papers_are_todays_lists(world, backend):
    """A refresh's dense lists (`kept_lists`): yesterday's universe lacked 5% of today's papers
    and held 5% with other topics or dates; a query whose lists hold none of the papers that
    changed or left keeps them, merged with the added papers' own lists, and those are the
    lists a search over today's universe gives (ties included: rounded scores); the others
    hold a changed paper."""
    docs, q = world["docs"], world["queries"]
    vectors = dict(zip(world["universe"].corpus_ids.tolist(), world["vectors"]))
    rng = np.random.default_rng(3)
    role = rng.integers(0, 20, docs.num_rows)  # 0: added today, 1: changed today
    changed = pa.array(role == 1)
    yesterday = docs.set_column(
        2, "topic_ids", pc.if_else(changed, pa.scalar([59], pa.list_(pa.int32())), docs[2])
    ).set_column(1, "date_key", pc.if_else(changed, pa.scalar(_date(10_001), pa.date32()), docs[1]))
    yesterday = yesterday.filter(pa.array(role != 0))

    def search(part: pa.Table) -> pa.Table:
        u = Universe(part)
        batch = QueryBatch.build(u, q)
        vecs = np.stack([vectors[i] for i in u.corpus_ids.tolist()])
        if backend == "Flat":
            hits = index_hits(VectorIndex(u.corpus_ids, vecs), u, world["qvecs"], batch)
        else:
            scores = np.round(np.maximum(world["qvecs"] @ vecs.T, 0), 1)
            hits = exact_hits(scores, batch, positive_only=True)
        return shard_hits(q, u, hits, "p")

    removed, added = universe_delta(yesterday, docs, ["date_key", "topic_ids"])
    assert len(removed) == int((role == 1).sum())
    assert added.num_rows == int((role <= 1).sum())
    kept, today = search(yesterday), search(docs)
    lost = losing_queries(kept, removed)
    keep = q["query_id"].filter(pc.invert(pc.is_in(q["query_id"], value_set=lost)))
    assert 0 < len(keep) < q.num_rows
    own = of_queries(search(added), keep)
    merged = merge_hits([of_queries(kept, keep), own], q.select(["query_id", "depth"]))
    assert _lists(merged) == _lists(of_queries(today, keep))
    # a query is reused only with the row it was searched for
    moved = q.set_column(1, "query", pa.array(["q"] * (q.num_rows - 1) + ["other"]))
    assert unchanged_queries(moved, q).to_pylist() == q["query_id"].to_pylist()[:-1]
