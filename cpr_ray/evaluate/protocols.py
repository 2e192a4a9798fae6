"""What the evaluation runner needs besides a retriever and a reranker, as a small typed
interface: a :class:`QueryRewriter` in front of any retriever (a returned string replaces the
query, as Query2doc does; a returned list is searched text by text and the rankings are fused
with reciprocal rank fusion, as HyDE's passages and RAG-Fusion's queries are). The list is
searched exactly as returned: a rewriter that wants the original query in the fusion puts it
there itself, once. Rerankers are
`cpr_ray.retrieval.rerank`'s, shared with search.

The LLM rewriters (`cpr_ray.evaluate.rewriters`) are imported only when a run asks for
``--rewrite …``, so a retrieval-only run pays nothing for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from cpr_ray.config import Config


@runtime_checkable
class QueryRewriter(Protocol):
    name: str  # "hyde", "query2doc", "rag-fusion"

    def rewrite(self, queries: Sequence[str]) -> list[str | list[str]]:
        """Per query, the text to search with, or several texts whose rankings are fused."""
        ...


REWRITE_KINDS = ("hyde", "query2doc", "rag-fusion")


def llm_query_rewriter(
    kind: str, cfg: Config, train_pairs: Sequence[tuple[str, str]]
) -> QueryRewriter:
    """The LLM rewriter `kind` (`cpr_ray.evaluate.rewriters`).

    `train_pairs` are (query, passage) examples of the benchmark's train split, for Query2doc.
    """
    if kind not in REWRITE_KINDS:
        raise ValueError(f"unknown rewrite {kind!r}; known: {', '.join(REWRITE_KINDS)}")
    from cpr_ray.evaluate.rewriters import query_rewriter

    return query_rewriter(kind, cfg, train_pairs)
