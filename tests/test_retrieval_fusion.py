"""Reciprocal rank fusion: by hand, against ranx, and inside the runner (RAG-Fusion path)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from cpr_ray.evaluate.benchmark import Benchmark, pad_pools
from cpr_ray.evaluate.runner import rank
from cpr_ray.retrieval.bm25 import BM25Retriever
from cpr_ray.retrieval.fusion import reciprocal_rank_fusion


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
