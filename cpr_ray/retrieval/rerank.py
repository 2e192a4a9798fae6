"""The tournament reranker (evaluation's and search's): the bookkeeping of ``tournament.py`` over
a judge's two calls (the LLM judge is ``llm_judge.py``).

Each round of all queries is one batch. A judge with ``choose_many``/``score_many`` gets the batch
whole (the LLM layer can send it as one table through its cache, ledger and retries); a judge with
per-call ``choose``/``score`` gets the batch's calls on a thread pool (they are I/O bound).
Counters of every fallback are summed over queries in ``stats``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, runtime_checkable

from cpr_ray.config import Config
from cpr_ray.errors import UserError
from cpr_ray.retrieval.tournament import (
    TournamentSpec,
    TournamentStats,
    run_tournaments,
)


@runtime_checkable
class Reranker(Protocol):
    name: str

    def rerank(
        self, queries: Sequence[str], candidates: Sequence[Sequence[str]]
    ) -> list[list[str]]:
        """Per query, the same candidate ids (document ids), reordered best first."""
        ...


@runtime_checkable
class TournamentJudge(Protocol):
    """The two LLM calls of the tournament; ids are document ids, texts are the judge's concern."""

    def choose(self, query: str, group: list[str], k: int) -> Sequence[str]:
        """The `k` ids of `group` most likely to help solve `query` (listwise)."""
        ...

    def score(self, query: str, doc_id: str) -> float:
        """How useful `doc_id` is for `query`, 0-10 (pointwise)."""
        ...


@runtime_checkable
class BatchTournamentJudge(Protocol):
    """The same two calls, a whole round at a time (requests from ``tournament.py``)."""

    def choose_many(self, requests: list[Any]) -> Sequence[Any]:
        """Per ChooseRequest(query_index, query, group, k): ids, or an Exception if it failed."""
        ...

    def score_many(self, requests: list[Any]) -> Sequence[Any]:
        """Per ScoreRequest(query_index, query, doc): a 0-10 score, or an Exception."""
        ...


def _threaded(fn: Callable[..., Any], workers: int) -> Callable[[list[Any]], list[Any]]:
    def call(req: Any) -> Any:
        try:
            return fn(*req[1:])  # requests are (query_index, *arguments)
        except UserError:  # a refused key or a dead endpoint stops the run, in one line
            raise
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
        self._choose_many: Callable[[list[Any]], Sequence[Any]]
        self._score_many: Callable[[list[Any]], Sequence[Any]]
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


def llm_reranker(cfg: Config, doc_texts: Mapping[str, str]) -> TournamentReranker:
    """The LLM tournament reranker of the config (`eval.tournament_rounds`, `rerank_workers`,
    `llm`), over documents given by id: evaluation's and search's alike."""
    from cpr_ray.retrieval.llm_judge import tournament_judge  # the LLM layer, only when asked

    return TournamentReranker(
        tournament_judge(cfg, doc_texts),
        TournamentSpec.parse(cfg.eval.tournament_rounds),
        max_workers=cfg.eval.rerank_workers,
    )
