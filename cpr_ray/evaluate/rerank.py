"""The tournament reranker: the bookkeeping of ``tournament.py`` over a judge's two calls.

Each round of all queries is one batch. A judge with ``choose_many``/``score_many`` gets the batch
whole (the LLM layer can send it as one table through its cache, ledger and retries); a judge with
per-call ``choose``/``score`` gets the batch's calls on a thread pool (they are I/O bound).
Counters of every fallback are summed over queries in ``stats``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cpr_ray.evaluate.protocols import BatchTournamentJudge, TournamentJudge
from cpr_ray.evaluate.tournament import (
    TournamentSpec,
    TournamentStats,
    run_tournaments,
)


def _threaded(fn: Callable[..., Any], workers: int) -> Callable[[list[Any]], list[Any]]:
    def call(req: Any) -> Any:
        try:
            return fn(*req[1:])  # requests are (query_index, *arguments)
        except Exception as exc:  # recorded by the bookkeeping, never fatal
            return exc

    def many(requests: list[Any]) -> list[Any]:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(call, requests))

    return many


class TournamentReranker:
    name = "llm-tournament"

    def __init__(
        self,
        judge: TournamentJudge | BatchTournamentJudge,
        spec: TournamentSpec | None = None,
        max_workers: int = 8,
    ) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.spec = spec or TournamentSpec()
        if isinstance(judge, BatchTournamentJudge):
            self._choose_many, self._score_many = judge.choose_many, judge.score_many
        elif isinstance(judge, TournamentJudge):
            self._choose_many = _threaded(judge.choose, max_workers)
            self._score_many = _threaded(judge.score, max_workers)
        else:
            raise TypeError("a tournament judge needs choose/score or choose_many/score_many")
        self.stats = TournamentStats()

    def rerank(
        self, queries: Sequence[str], candidates: Sequence[Sequence[str]]
    ) -> list[list[str]]:
        rankings, stats = run_tournaments(
            queries, candidates, self._choose_many, self._score_many, self.spec
        )
        for s in stats:
            self.stats.add(s)
        return rankings
