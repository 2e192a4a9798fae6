"""The tournament reranker: the bookkeeping of ``tournament.py`` over a judge's two calls.

Queries run concurrently in a thread pool (the judge's calls are I/O bound); within a query the
rounds run in order. Counters of every fallback are summed over queries in ``stats``.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from cpr_ray.evaluate.protocols import TournamentJudge
from cpr_ray.evaluate.tournament import TournamentSpec, TournamentStats, run_tournament


class TournamentReranker:
    name = "llm-tournament"

    def __init__(
        self, judge: TournamentJudge, spec: TournamentSpec | None = None, max_workers: int = 8
    ) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.judge = judge
        self.spec = spec or TournamentSpec()
        self.max_workers = max_workers
        self.stats = TournamentStats()

    def rerank(
        self, queries: Sequence[str], candidates: Sequence[Sequence[str]]
    ) -> list[list[str]]:
        if len(queries) != len(candidates):
            raise ValueError(f"{len(candidates)} candidate lists for {len(queries)} queries")

        def one(i: int) -> tuple[list[str], TournamentStats]:
            return run_tournament(
                queries[i], list(candidates[i]), self.judge.choose, self.judge.score, self.spec
            )

        with ThreadPoolExecutor(max_workers=self.max_workers) as pool:
            results = list(pool.map(one, range(len(queries))))
        for _, stats in results:
            self.stats.add(stats)
        return [ranking for ranking, _ in results]
