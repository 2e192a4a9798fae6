"""Reciprocal rank fusion: by hand, against ranx, and inside the runner (RAG-Fusion path)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from cpr_ray.evaluate.benchmark import Benchmark, pad_pools
from cpr_ray.evaluate.eval_run import rank
from cpr_ray.retrieval.bm25 import BM25Retriever
from cpr_ray.retrieval.fusion import Fusion, reciprocal_rank_fusion


def test_rrf_by_hand():
    fused = reciprocal_rank_fusion([["a", "b", "c"], ["c", "d", "a"]], k=60)
    # a: 1/61 + 1/63; c: 1/63 + 1/61 (tie: both best rank 1, a seen first); b, d: 1/62
    assert fused == ["a", "c", "b", "d"]
    assert reciprocal_rank_fusion([["x", "y"]], k=0) == ["x", "y"]
    assert reciprocal_rank_fusion([["a", "b"], ["b"]], weights=[1, 3])[0] == "b"
    assert reciprocal_rank_fusion([["a", "a", "b"]]) == ["a", "b"]  # repeats count once
    assert reciprocal_rank_fusion([["a", "b", "c"]], top_n=2) == ["a", "b"]
    with pytest.raises(ValueError):
        reciprocal_rank_fusion([["a"]], weights=[1, 2])


def test_rrf_matches_ranx():
    from ranx import Run, fuse

    rng = np.random.default_rng(0)
    docs = [f"d{i}" for i in range(50)]
    lists = [list(rng.permutation(docs)[: rng.integers(10, 50)]) for _ in range(4)]
    runs = [Run({"q": {d: float(len(lst) - r) for r, d in enumerate(lst)}}) for lst in lists]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = fuse(runs=runs, method="rrf", params={"k": 60}, norm=None).to_dict()["q"]
    ours = reciprocal_rank_fusion(lists, k=60)
    expected = sorted(ref, key=lambda d: -ref[d])
    assert set(ours) == set(expected)
    scores = [ref[d] for d in ours]
    assert scores == sorted(scores, reverse=True)  # same order up to exact ties


def test_runner_fuses_several_texts_per_query():
    docs = ["solar panels convert light", "wind turbines", "light bulbs", "bulb and panel shop"]
    bench = Benchmark(
        name="toy",
        query_ids=["q"],
        queries=["panels"],
        doc_ids=["a", "b", "c", "d"],
        doc_texts=docs,
        qrels=[{0: 1}],
        pools=pad_pools([[0, 1, 2, 3]]),
    )
    bm25 = BM25Retriever()
    bm25.index(docs)
    single = rank(bench, bm25, ["light"])
    fused = rank(bench, bm25, [["light", "panel", "bulb"]])
    expected = reciprocal_rank_fusion(
        [rank(bench, bm25, [t])[0].tolist() for t in ("light", "panel", "bulb")]
    )
    assert fused[0].tolist() == expected
    assert sorted(fused[0].tolist()) == [0, 1, 2, 3] and single[0].tolist() != fused[0].tolist()
    with pytest.raises(ValueError, match="no text"):
        rank(bench, bm25, [[]])


def test_hybrid_fusion_by_hand_ranks_and_tie_break():
    """RRF over two sides: each fused hit names its rank on each side; equal fused scores go
    to the better best rank, then to the dense side's order (a stated, reproducible rule)."""
    rrf = Fusion()
    dense, bm25 = [("a", 0.9), ("b", 0.8), ("c", 0.7)], [("c", 12.0), ("d", 9.0)]
    fused = rrf.fuse(dense, bm25)
    # c: 1/63 + 1/61; a: 1/61; d: 1/62 ties b: 1/62 (both best rank 2): b is dense's, first
    assert [(f.doc, f.dense_rank, f.bm25_rank) for f in fused] == [
        ("c", 3, 1),
        ("a", 1, None),
        ("b", 2, None),
        ("d", None, 2),
    ]
    assert fused[0].score == pytest.approx(1 / 63 + 1 / 61)
    assert [f.doc for f in rrf.fuse(dense, bm25, top_n=2)] == ["c", "a"]
    assert rrf.describe() == {"method": "rrf", "k": 60, "depth": 100}
    convex = Fusion(method="convex", weight=0.25, depth=3)
    assert convex.describe() == {"method": "convex", "weight": 0.25, "depth": 3}
    # min-max per side: dense a 1, b .5, c 0; bm25 c 1, d 0 -> c .75, a .25, b .125, d 0
    got = convex.fuse(dense, bm25)
    assert [f.doc for f in got] == ["c", "a", "b", "d"]
    assert [f.score for f in got] == pytest.approx([0.75, 0.25, 0.125, 0.0])
    with pytest.raises(ValueError, match="method\n  Input should be .* input_value='max'"):
        Fusion(method="max")


def test_sides_drop_the_excluded_and_bm25_non_matches_before_the_cut():
    """A query's excluded paper is dropped from both sides before each is cut to its depth (so
    the side's next paper takes its place, as a filter would give), and BM25's zero scores are
    no match: they never enter the fusion."""
    fusion = Fusion(depth=2)
    dense, bm25 = fusion.sides(
        [5, 7, 9, -1], [0.9, 0.8, 0.7, -np.inf], [7, 3, 4], [4.0, 2.0, 0.0], 2, {7}
    )
    assert dense == [(5, 0.9), (9, pytest.approx(0.7))]
    assert bm25 == [(3, 2.0)]
    assert fusion.side_depth(5) == 5  # more hits asked for than the depth: each side gives them


def test_convex_fusion_matches_ranx_wsum():
    """The convex sum against ranx's weighted sum of min-max normalised runs."""
    from ranx import Run, fuse

    rng = np.random.default_rng(1)
    docs = [f"d{i}" for i in range(40)]
    sides = [
        [(d, float(s)) for d, s in zip(rng.permutation(docs)[:25], np.sort(rng.random(25))[::-1])]
        for _ in range(2)
    ]
    runs = [Run({"q": dict(side)}) for side in sides]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = fuse(runs, method="wsum", norm="min-max", params={"weights": [0.7, 0.3]})
    want = ref.to_dict()["q"]
    got = Fusion(method="convex", weight=0.7, depth=25).fuse(*sides)
    assert {f.doc for f in got} == set(want)
    for f in got:
        assert f.score == pytest.approx(want[f.doc], abs=1e-9)
