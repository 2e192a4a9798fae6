"""The one retriever interface, and the conventions its arrays follow.

A retriever indexes a collection of documents (by position), then either scores each query's
candidate pool or searches the whole index:

- ``index(texts)``;
- ``score(queries, pools) -> (n_q, m)`` scores aligned with ``pools`` (PAD cells: -inf);
- ``search(queries, k) -> (positions (n_q, k), scores (n_q, k))``, best first.

Encoder-backed retrievers also have ``uses_ray(n_docs)``: a caller then makes sure Ray is up
before ``index`` so that a large collection is encoded on an actor pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import pyarrow as pa

from cpr_ray.tables.schemas import paper_text

PAD = -1  # fills a padded matrix of document positions past each row's end


@runtime_checkable
class Retriever(Protocol):
    # read-only: a retriever may narrow them (BM25's model is always None)
    @property
    def name(self) -> str: ...

    @property
    def model(self) -> str | None: ...

    def index(self, texts: Sequence[str]) -> None: ...

    def score(self, queries: Sequence[str], pools: np.ndarray) -> np.ndarray: ...

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]: ...


def top_k_rows(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Column indices and scores of the k best per row (best first) of a dense score matrix.

    Equal scores go to the lower column, so a search is reproducible whatever the partition did.
    """
    k = min(k, scores.shape[1])
    if k == 0:
        empty = np.zeros((scores.shape[0], 0))
        return empty.astype(np.int64), empty
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]  # (n_q, k) unordered
    part_scores = np.take_along_axis(scores, part, axis=1)
    # argpartition keeps any of the columns tied at the k-th score: keep the lowest ones (rows
    # tied at -inf, masked out, are left: those entries are no result)
    kth = part_scores.min(axis=1)
    tied = (scores == kth[:, None]).sum(axis=1) > (part_scores == kth[:, None]).sum(axis=1)
    tied &= np.isfinite(kth)
    for r in np.flatnonzero(tied):
        above = np.flatnonzero(scores[r] > kth[r])
        part[r] = np.r_[above, np.flatnonzero(scores[r] == kth[r])[: k - len(above)]]
    part_scores = np.take_along_axis(scores, part, axis=1)
    order = np.lexsort((part, -part_scores), axis=-1)  # score desc, then lower index
    idx = np.take_along_axis(part, order, axis=1)
    return idx.astype(np.int64), np.take_along_axis(scores, idx, axis=1)


def document_texts(
    title: pa.Array | pa.ChunkedArray, body: pa.Array | pa.ChunkedArray
) -> list[str]:
    """The one paper text (`schemas.paper_text`) of each document, as evaluation (CPR-eval,
    BEIR) and the search index encode it: what was judged and trained on is what is searched."""
    return paper_text(title, body).to_pylist()
