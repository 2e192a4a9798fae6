"""Metrics against ranx on the same runs; random-ranking expectations; seeded bootstrap."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from cpr_ray.evaluate.bootstrap import bootstrap_ci, sub_seed
from cpr_ray.evaluate.ir_metrics import METRICS, judge, per_query, random_expectation

RANX_NAMES = {
    "recall_at_1": "recall@1",
    "recall_at_5": "recall@5",
    "recall_at_10": "recall@10",
    "recall_at_100": "recall@100",
    "mrr_at_10": "mrr@10",
}


def _random_runs(seed: int, n_queries: int = 60, n_docs: int = 150):
    """Graded qrels (0-3, some judged non-relevant) and runs with distinct scores."""
    rng = np.random.default_rng(seed)
    qrels, runs = [], []
    for _ in range(n_queries):
        judged = rng.choice(n_docs, size=rng.integers(1, 12), replace=False)
        grades = rng.integers(0, 4, size=len(judged))
        grades[0] = max(grades[0], 1)  # at least one relevant
        qrels.append({int(d): int(g) for d, g in zip(judged, grades)})
        depth = int(rng.integers(3, 130))  # runs shorter and longer than the cut-offs
        ranked = rng.permutation(n_docs)[:depth]
        runs.append(ranked)
    return qrels, runs


def _ranx(qrels, runs, names):
    from ranx import Qrels, Run, evaluate

    q = Qrels({f"q{i:04d}": {f"d{d}": g for d, g in rel.items()} for i, rel in enumerate(qrels)})
    r = Run(
        {
            f"q{i:04d}": {f"d{d}": float(len(ranked) - rank) for rank, d in enumerate(ranked)}
            for i, ranked in enumerate(runs)
        }
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return evaluate(q, r, names, return_mean=False, make_comparable=True)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metrics_match_ranx_per_query(seed):
    qrels, runs = _random_runs(seed)
    ours_exp = per_query(judge(runs, qrels), gain="exponential")
    ours_lin = per_query(judge(runs, qrels), gain="linear")
    ref = _ranx(qrels, runs, [*RANX_NAMES.values(), "ndcg@10", "ndcg_burges@10"])
    for ours_name, ranx_name in RANX_NAMES.items():
        np.testing.assert_allclose(ours_exp[ours_name], ref[ranx_name], atol=1e-12)
    # 2^rel - 1 gains are ranx's ndcg_burges; linear gains its (and trec_eval's) ndcg
    np.testing.assert_allclose(ours_exp["ndcg_at_10"], ref["ndcg_burges@10"], atol=1e-12)
    np.testing.assert_allclose(ours_lin["ndcg_at_10"], ref["ndcg@10"], atol=1e-12)
    # the graded data actually exercises a difference between the two gains
    assert not np.allclose(ours_exp["ndcg_at_10"], ours_lin["ndcg_at_10"])


def test_metrics_by_hand():
    # relevant: 7 (grade 2) and 9 (grade 1); ranking puts 9 second and 7 twelfth
    ranked = [np.array([1, 9, 2, 3, 4, 5, 6, 8, 10, 11, 12, 7])]
    m = per_query(judge(ranked, [{7: 2, 9: 1, 1: 0}]))
    assert m["recall_at_1"][0] == 0
    assert m["recall_at_5"][0] == m["recall_at_10"][0] == 0.5
    assert m["mrr_at_10"][0] == 0.5
    ideal = 3 / np.log2(2) + 1 / np.log2(3)
    assert m["ndcg_at_10"][0] == pytest.approx((1 / np.log2(3)) / ideal)


def test_query_without_relevant_document_is_refused():
    with pytest.raises(ValueError, match="no relevant document"):
        judge([np.array([1, 2])], [{1: 0}])


def test_random_expectation_closed_form_for_cpr_pool():
    # one positive among 151 candidates: the paper's random line
    j = judge([np.arange(151)], [{0: 1}])
    r = random_expectation(np.array([151]), [np.array([1.0])], j.n_relevant, j.ideal_grades)
    assert r["recall_at_1"][0] == pytest.approx(1 / 151)
    assert r["recall_at_5"][0] == pytest.approx(5 / 151)
    assert r["recall_at_10"][0] == pytest.approx(10 / 151)
    assert r["mrr_at_10"][0] == pytest.approx(sum(1 / i for i in range(1, 11)) / 151)
    assert round(r["recall_at_10"][0], 2) == 0.07 and round(r["mrr_at_10"][0], 2) == 0.02


def test_random_expectation_matches_simulation():
    """Several relevant documents with grades, one outside the pool: exact vs Monte Carlo."""
    rng = np.random.default_rng(7)
    n, qrels = 30, {0: 3, 1: 1, 2: 2, 99: 1}  # document 99 is not in the pool of 0..29
    pool = np.arange(n)
    j = judge([pool], [qrels])
    exact = random_expectation(
        np.array([n]), [np.array([3.0, 1.0, 2.0])], j.n_relevant, j.ideal_grades
    )
    sims = [per_query(judge([rng.permutation(pool)], [qrels])) for _ in range(20_000)]
    for m in METRICS:
        mc = np.mean([s[m][0] for s in sims])
        assert exact[m][0] == pytest.approx(mc, abs=0.006), m


def test_random_expectation_small_pool():
    # four options, one right: accuracy 1/4, and every relevant doc is inside the top 10
    j = judge([np.arange(4)], [{2: 1}])
    r = random_expectation(np.array([4]), [np.array([1.0])], j.n_relevant, j.ideal_grades)
    assert r["recall_at_1"][0] == 0.25 and r["recall_at_10"][0] == 1.0
    assert r["mrr_at_10"][0] == pytest.approx((1 + 1 / 2 + 1 / 3 + 1 / 4) / 4)


def test_bootstrap_is_deterministic_with_a_seed_and_brackets_the_mean():
    values = {"a": np.random.default_rng(0).random(500), "b": np.linspace(0, 1, 500)}
    first = bootstrap_ci(values, seed=3)
    assert first == bootstrap_ci(values, seed=3)
    assert first != bootstrap_ci(values, seed=4)
    for k, v in values.items():
        low, high = first[k]
        assert low < v.mean() < high
        # normal approximation of the interval of a mean, within 15%
        half = 1.96 * v.std(ddof=1) / np.sqrt(len(v))
        assert (high - low) / 2 == pytest.approx(half, rel=0.15)


def test_bootstrap_chunking_does_not_change_results(monkeypatch):
    """Resamples are drawn in chunks (memory bound): 700 of them in chunks of 250, 250 and 200,
    or of 64, give exactly the intervals of one 700-row draw."""
    from cpr_ray.evaluate import bootstrap

    values = {"a": np.random.default_rng(1).random(50), "b": np.random.default_rng(2).random(50)}
    idx = np.random.default_rng(5).integers(0, 50, size=(700, 50))  # one draw, no chunks
    reference = {
        k: (
            float(np.percentile(v[idx].mean(axis=1), 2.5)),
            float(np.percentile(v[idx].mean(axis=1), 97.5)),
        )
        for k, v in values.items()
    }
    assert 700 > 2 * bootstrap._CHUNK
    assert bootstrap_ci(values, resamples=700, seed=5) == reference
    monkeypatch.setattr(bootstrap, "_CHUNK", 64)
    assert bootstrap_ci(values, resamples=700, seed=5) == reference
    assert bootstrap_ci({"a": np.ones(10)}, seed=0)["a"] == (1.0, 1.0)


def test_sub_seed_is_stable_and_distinct():
    assert sub_seed(0, "Life Sciences") == sub_seed(0, "Life Sciences")
    assert sub_seed(0, "Life Sciences") != sub_seed(0, "Physical Sciences")
    assert sub_seed(0, "x") != sub_seed(1, "x")
