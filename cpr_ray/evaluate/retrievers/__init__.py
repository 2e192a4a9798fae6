"""Retrievers by name behind one interface: bm25, dense, splade."""

from cpr_ray.evaluate.retrievers.base import (
    RETRIEVERS,
    Retriever,
    RetrieverOptions,
    make_retriever,
)

__all__ = ["RETRIEVERS", "Retriever", "RetrieverOptions", "make_retriever"]
