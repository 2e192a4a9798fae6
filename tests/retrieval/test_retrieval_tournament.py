"""The tournament reranker's bookkeeping with scripted choosers and scorers (no LLM)."""

from __future__ import annotations

import numpy as np
import pytest

from cpr_ray.evaluate.benchmark import Benchmark, pad_pools
from cpr_ray.evaluate.eval_run import rerank
from cpr_ray.retrieval.rerank import TournamentReranker
from cpr_ray.retrieval.tournament import (
    Round,
    TournamentSpec,
    quotas,
    run_tournament,
    split_groups,
)

CANDS = [f"d{i}" for i in range(151)]
# best first; spread so that no group holds more of them than it may keep (see below)
GOOD = ["d145", "d5", "d80", "d50", "d100", "d35", "d115", "d60", "d95", "d135"]


class Scripted:
    """Prefers known ids in a fixed order; scores them by that order. Records every call."""

    def __init__(self, preferred=GOOD):
        self.rank = {d: i for i, d in enumerate(preferred)}
        self.calls: list[tuple[int, int]] = []  # (group size, k)

    def choose(self, query, group, k):
        self.calls.append((len(group), k))
        liked = sorted((d for d in group if d in self.rank), key=self.rank.__getitem__)
        rest = [d for d in reversed(group) if d not in self.rank]  # deliberately not input order
        return (liked + rest)[:k]

    def score(self, query, doc):
        return 10 - self.rank[doc] if doc in self.rank else 0.0


def test_full_tournament_puts_the_preferred_ten_on_top_in_score_order():
    judge = Scripted()
    ranking, stats = run_tournament("q", CANDS, judge.choose, judge.score)
    assert ranking[:10] == GOOD
    rest = [c for c in CANDS if c not in GOOD]
    assert ranking[10:] == rest  # everything else keeps its input order
    assert sorted(ranking) == sorted(CANDS)
    # 151 in groups of <= 25: seven groups (4 x 22 + 3 x 21) keeping 30 in proportion to size
    # (5, 5, 4, 4, 4, 4, 4); then 30 in two groups of 15 keeping 5 each -> 10
    assert judge.calls == [(22, 5), (22, 5), (22, 4), (22, 4), (21, 4), (21, 4), (21, 4)] + [
        (15, 5),
        (15, 5),
    ]
    assert stats.choose_calls == 9 and stats.score_calls == 10
    assert stats.unknown_ids == stats.duplicate_ids == stats.short_groups == 0


def test_groups_not_dividing_evenly():
    assert [len(g) for g in split_groups(list(range(151)), 25)] == [22] * 4 + [21] * 3
    assert [len(g) for g in split_groups(list(range(11)), 5)] == [4, 4, 3]
    assert split_groups([], 5) == []
    assert quotas([22] * 4 + [21] * 3, 30) == [5, 5, 4, 4, 4, 4, 4]
    assert quotas([4, 4, 3], 5) == [2, 2, 1]
    assert quotas([3, 3], 10) == [3, 3]  # more survivors than candidates: keep all
    assert quotas([1, 9], 2) == [0, 2]


def test_odd_spec_with_uneven_groups_still_returns_a_permutation():
    spec = TournamentSpec(rounds=(Round(7, 9), Round(4, 3)))
    judge = Scripted(["d5", "d1", "d30"])
    ranking, stats = run_tournament("q", CANDS[:37], judge.choose, judge.score, spec)
    # round 1: groups 7,6,6,6,6,6 keep 2,2,2,1,1,1 -> d1 d5 | d11 d12 | d17 d18 | d24 | d30 | d36
    # round 2: groups [d1 d5 d11] [d12 d17 d18] [d24 d30 d36] keep one each: d5, d18, d30;
    # d1 loses to d5 in its group although it is preferred over d30
    assert ranking[:3] == ["d5", "d30", "d18"]
    assert sorted(ranking) == sorted(CANDS[:37])
    assert stats.score_calls == 3


def test_chooser_answers_are_sanitised_and_counted():
    def messy(query, group, k):
        # unknown id, a duplicate, then too few real ids
        return ["not-a-candidate", group[-1], group[-1], None, ["unhashable"]]

    def score(query, doc):
        return 5.0

    spec = TournamentSpec(rounds=(Round(10, 6), Round(3, 2)))
    cands = CANDS[:20]
    ranking, stats = run_tournament("q", cands, messy, score, spec)
    # round 1: two groups of 10, quota 3 each: picks group[-1] then fills 2 in input order
    # survivors d0 d1 d9 | d10 d11 d19; round 2: groups of 3, quota 1 -> d9 and d19
    assert ranking[:2] == ["d9", "d19"]
    assert sorted(ranking) == sorted(cands)
    assert stats.unknown_ids == 4 * 3  # 'not-a-candidate', None, the list; in each of 4 calls
    assert stats.duplicate_ids == 4
    assert stats.short_groups == 2 and stats.filled_ids == 4


def test_chooser_returning_too_many_or_failing():
    def greedy(query, group, k):
        return list(reversed(group))  # everything

    def broken(query, group, k):
        raise TimeoutError("LLM timed out")

    spec = TournamentSpec(rounds=(Round(5, 4), Round(2, 2)))
    _, stats = run_tournament("q", CANDS[:10], greedy, lambda q, d: 1.0, spec)
    assert stats.extra_ids == 2 * (5 - 2) + 2 * (2 - 1)
    ranking, stats = run_tournament("q", CANDS[:10], broken, lambda q, d: 1.0, spec)
    assert stats.choose_errors == stats.choose_calls == 4
    # fallbacks fill in input order: d0 d1 | d5 d6, then d0 | d5; equal scores keep input order
    assert ranking == ["d0", "d5", "d1", "d2", "d3", "d4", "d6", "d7", "d8", "d9"]


def test_bad_scores_rank_last_and_are_counted():
    spec = TournamentSpec(rounds=(Round(4, 4),))
    values = {"d0": 3.0, "d1": float("nan"), "d2": 11.0, "d3": 7.0}

    def score(query, doc):
        if doc == "d4":
            raise RuntimeError("no JSON")
        return values.get(doc, "7")  # a string is not a score

    ranking, stats = run_tournament("q", CANDS[:4], lambda q, g, k: g[:k], score, spec)
    assert ranking == ["d3", "d0", "d1", "d2"]
    assert stats.score_failures == 2 and stats.rounds_skipped == 1


def test_fewer_candidates_than_final_ten_skips_rounds():
    judge = Scripted(["d2"])
    ranking, stats = run_tournament("q", CANDS[:6], judge.choose, judge.score)
    assert ranking[0] == "d2" and sorted(ranking) == sorted(CANDS[:6])
    assert stats.rounds_skipped == 2 and stats.choose_calls == 0 and stats.score_calls == 6


def test_spec_validation():
    with pytest.raises(ValueError, match="decrease"):
        TournamentSpec(rounds=(Round(10, 10), Round(5, 10)))
    with pytest.raises(ValueError, match="group_size"):
        Round(1, 1)
    with pytest.raises(ValueError, match="unique"):
        run_tournament("q", ["a", "a"], lambda q, g, k: g, lambda q, d: 0)


def test_reranker_in_the_runner_reorders_only_the_head():
    docs = [f"d{i}" for i in range(30)]
    bench = Benchmark(
        name="toy",
        query_ids=["q0", "q1"],
        queries=["first", "second"],
        doc_ids=docs,
        doc_texts=docs,
        qrels=[{0: 1}, {1: 1}],
        pools=pad_pools([list(range(30)), list(range(12))]),
    )
    first_stage = [np.roll(np.arange(30), 5), np.arange(12)]  # d0, d1 inside the top 20
    judge = Scripted(["d0", "d1"])
    reranker = TournamentReranker(judge, TournamentSpec(rounds=(Round(6, 6), Round(3, 2))))
    out = rerank(bench, first_stage, reranker, depth=20)
    assert out[0][:2].tolist() == [0, 1]
    assert out[0][20:].tolist() == first_stage[0][20:].tolist()  # below depth: untouched
    assert sorted(out[0].tolist()) == list(range(30))
    # 12 candidates: d0 d1 d5 | d9 d10 d11 survive round 1; round 2 groups those in threes, so
    # d1 meets d0 and loses, and the scripted judge's pick of the second group (d11) is second
    assert out[1][:2].tolist() == [0, 11]
    assert reranker.stats.queries == 2


def test_reranker_that_drops_a_candidate_is_an_error():
    class Dropper:
        name = "dropper"

        def rerank(self, queries, candidates):
            return [list(c)[1:] for c in candidates]

    bench = Benchmark(
        name="toy",
        query_ids=["q"],
        queries=["x"],
        doc_ids=["a", "b"],
        doc_texts=["a", "b"],
        qrels=[{0: 1}],
        pools=pad_pools([[0, 1]]),
    )
    with pytest.raises(ValueError, match="changed the candidate set of query q"):
        rerank(bench, [np.array([0, 1])], Dropper(), None)


class BatchScripted:
    """The same preferences, answered a whole round at a time; records the batch sizes."""

    def __init__(self, preferred=GOOD, fail_scores=False):
        self.one = Scripted(preferred)
        self.choose_batches: list[int] = []
        self.score_batches: list[int] = []
        self.fail_scores = fail_scores

    def choose_many(self, requests):
        self.choose_batches.append(len(requests))
        return [self.one.choose(r.query, r.group, r.k) for r in requests]

    def score_many(self, requests):
        self.score_batches.append(len(requests))
        if self.fail_scores:
            raise ConnectionError("endpoint down")
        return [self.one.score(r.query, r.doc) for r in requests]


def test_batched_rounds_equal_per_query_tournaments():
    rng = np.random.default_rng(0)
    queries = [f"q{i}" for i in range(5)]
    cands = [list(rng.permutation(CANDS)[:n]) for n in (151, 151, 40, 9, 151)]
    judge = BatchScripted()
    reranker = TournamentReranker(judge)
    batched = reranker.rerank(queries, cands)
    for q, c, got in zip(queries, cands, batched):
        plain = Scripted()
        expected, _ = run_tournament(q, c, plain.choose, plain.score)
        assert got == expected
    # one batch per round for all queries, one for the scores
    assert len(judge.choose_batches) == 2 and len(judge.score_batches) == 1
    assert judge.choose_batches[0] == 7 + 7 + 2 + 0 + 7  # the 9-candidate query skips rounds
    assert judge.score_batches == [10 + 10 + 10 + 9 + 10]
    assert reranker.stats.queries == 5 and reranker.stats.rounds_skipped == 2


def test_a_failed_batch_is_counted_not_fatal():
    judge = BatchScripted(fail_scores=True)
    reranker = TournamentReranker(judge)
    out = reranker.rerank(["q"], [CANDS])
    assert reranker.stats.score_failures == 10 and sorted(out[0]) == sorted(CANDS)
    with pytest.raises(TypeError, match="choose/score or choose_many/score_many"):
        TournamentReranker(object())


def test_a_refused_key_stops_the_tournament_instead_of_being_a_failed_item():
    """A timeout is one item's failure; a refused key or a dead endpoint (a UserError, raised
    by the probe before any call) is every item's: it ends the run with its one line."""
    from cpr_ray.llm.client import LLMConfigError

    def refused(*args):
        raise LLMConfigError("http://llm/v1 refused the API key (HTTP 401)")

    spec = TournamentSpec(rounds=(Round(5, 4), Round(2, 2)))
    with pytest.raises(LLMConfigError, match="refused the API key"):
        run_tournament("q", CANDS[:10], refused, lambda q, d: 1.0, spec)
    judge = BatchScripted(fail_scores=True)
    judge.score_many = lambda requests: refused()
    with pytest.raises(LLMConfigError, match="refused the API key"):
        TournamentReranker(judge).rerank(["q"], [CANDS])
