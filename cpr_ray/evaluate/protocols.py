"""What the evaluation runner needs from the LLM layer, as small typed interfaces.

The runner never talks to an LLM itself. It calls:

- a :class:`Reranker` on each query's first-stage ranking (the tournament reranker is
  :class:`cpr_ray.evaluate.rerank.TournamentReranker` over a :class:`TournamentJudge`, or a
  :class:`BatchTournamentJudge` that answers a whole round of all queries at once);
- a :class:`QueryRewriter` in front of any retriever: a returned string replaces the query
  (HyDE, Query2doc), a returned list is searched query by query and the rankings are fused with
  reciprocal rank fusion (RAG-Fusion).

The LLM layer provides them through the hooks named in ``LLM_HOOKS``; until it does, asking for
``--rerank llm`` or ``--rewrite …`` fails with :class:`LLMLayerMissing`, naming the hook.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from cpr_ray.errors import UserError


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

# hook -> (module, factory) that the LLM layer provides
LLM_HOOKS = {
    "rerank": ("cpr_ray.llm.evaluate", "tournament_judge"),
    "rewrite": ("cpr_ray.llm.evaluate", "query_rewriter"),
}


class LLMLayerMissing(UserError):
    """The LLM layer (cpr_ray.llm) does not provide what an evaluation option needs yet."""


def require_hook(kind: str) -> None:
    """Fail now, before any loading or encoding, when the LLM layer lacks hook `kind`."""
    _hook(kind)


def _hook(kind: str) -> Any:
    module_name, attr = LLM_HOOKS[kind]
    what = "--rerank llm" if kind == "rerank" else "--rewrite"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module_name.startswith(exc.name):
            raise
        raise LLMLayerMissing(
            f"{what} needs the LLM layer: module {module_name} (with {attr}()) is not part of "
            "this installation yet"
        ) from None
    factory = getattr(module, attr, None)
    if factory is None:
        raise LLMLayerMissing(f"{what} needs {module_name}.{attr}(), which does not exist yet")
    return factory


def llm_tournament_judge(
    llm_cfg: Any, doc_texts: Mapping[str, str]
) -> TournamentJudge | BatchTournamentJudge:
    """`cpr_ray.llm.evaluate.tournament_judge(llm_cfg, doc_texts)` from the LLM layer."""
    return _hook("rerank")(llm_cfg, doc_texts)


def llm_query_rewriter(
    kind: str, llm_cfg: Any, train_pairs: Sequence[tuple[str, str]]
) -> QueryRewriter:
    """`cpr_ray.llm.evaluate.query_rewriter(kind, llm_cfg, train_pairs)` from the LLM layer.

    `train_pairs` are (query, passage) examples of the benchmark's train split, for Query2doc.
    """
    if kind not in REWRITE_KINDS:
        raise ValueError(f"unknown rewrite {kind!r}; known: {', '.join(REWRITE_KINDS)}")
    return _hook("rewrite")(kind, llm_cfg, train_pairs)
