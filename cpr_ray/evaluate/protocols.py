"""What the evaluation runner needs from the LLM layer, as small typed interfaces.

The runner never talks to an LLM itself. It calls:

- a :class:`Reranker` on each query's first-stage ranking (the tournament reranker is
  :class:`cpr_ray.evaluate.rerank.TournamentReranker` over a :class:`TournamentJudge`, or a
  :class:`BatchTournamentJudge` that answers a whole round of all queries at once);
- a :class:`QueryRewriter` in front of any retriever: a returned string replaces the query
  (HyDE, Query2doc), a returned list is searched query by query and the rankings are fused with
  reciprocal rank fusion (RAG-Fusion).

The LLM layer (``cpr_ray.llm.evaluate``) provides them; it is imported only when a run asks
for ``--rerank llm`` or ``--rewrite …``, so a retrieval-only run pays nothing for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from cpr_ray.config import Config


@runtime_checkable
class Reranker(Protocol):
    name: str

    def rerank(
        self, queries: Sequence[str], candidates: Sequence[Sequence[str]]
    ) -> list[list[str]]:
        """Per query, the same candidate ids (document ids), reordered best first."""
        ...


@runtime_checkable
class QueryRewriter(Protocol):
    name: str  # "hyde", "query2doc", "rag-fusion"

    def rewrite(self, queries: Sequence[str]) -> list[str | list[str]]:
        """Per query, the text to search with, or several texts whose rankings are fused."""
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


REWRITE_KINDS = ("hyde", "query2doc", "rag-fusion")


def llm_tournament_judge(
    cfg: Config, doc_texts: Mapping[str, str]
) -> TournamentJudge | BatchTournamentJudge:
    """`cpr_ray.llm.evaluate.tournament_judge(cfg, doc_texts)` from the LLM layer."""
    from cpr_ray.llm.evaluate import tournament_judge

    return tournament_judge(cfg, doc_texts)


def llm_query_rewriter(
    kind: str, cfg: Config, train_pairs: Sequence[tuple[str, str]]
) -> QueryRewriter:
    """`cpr_ray.llm.evaluate.query_rewriter(kind, cfg, train_pairs)` from the LLM layer.

    `train_pairs` are (query, passage) examples of the benchmark's train split, for Query2doc.
    """
    if kind not in REWRITE_KINDS:
        raise ValueError(f"unknown rewrite {kind!r}; known: {', '.join(REWRITE_KINDS)}")
    from cpr_ray.llm.evaluate import query_rewriter

    return query_rewriter(kind, cfg, train_pairs)
