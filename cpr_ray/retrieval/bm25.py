"""BM25 with bm25s: Lucene variant, k1 = 1.2, b = 0.75, English stop words and Snowball stemming.

Statistics (IDF, average length) come from the indexed documents: the corpus, or for pooled
benchmarks the union of all pools.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence

import bm25s
import numpy as np
import Stemmer

from cpr_ray.errors import InputError
from cpr_ray.retrieval.base import PAD, top_k_rows
from cpr_ray.storage import Storage, join


class EmptyVocabulary(InputError):
    """No document of a collection has a term BM25 can index."""


class BM25Retriever:
    name = "bm25"
    model = None

    def __init__(self, k1: float = 1.2, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self._stemmer = Stemmer.Stemmer("english")
        self._bm25: bm25s.BM25 | None = None
        self._n_docs = 0

    def _tokens(self, texts: Sequence[str]) -> list[list[str]]:
        return bm25s.tokenize(
            list(texts),
            lower=True,
            stopwords="en",
            stemmer=self._stemmer,
            return_ids=False,
            show_progress=False,
        )

    def index(self, texts: Sequence[str]) -> None:
        """Index `texts`. A document with no indexable term scores 0 for every query; a
        collection with none at all is refused: every score would be 0 and every ranking a
        tie, figures that look like results and measure nothing."""
        tokens = bm25s.tokenize(
            list(texts), lower=True, stopwords="en", stemmer=self._stemmer, show_progress=False
        )
        if not tokens.vocab:  # bm25s itself fails on it with "max() arg is an empty sequence"
            raise EmptyVocabulary(
                f"BM25: none of the {len(texts):,} documents has a word to index (each is empty, "
                "English stop words or one-letter tokens)"
            )
        self._bm25 = bm25s.BM25(k1=self.k1, b=self.b, method="lucene")
        self._bm25.index(tokens, show_progress=False)
        self._n_docs = len(texts)

    def save(self, storage: Storage, uri: str) -> None:
        """bm25s's own files (NumPy arrays and JSON, no pickle) under `uri`, on any storage."""
        assert self._bm25 is not None, "index() first"
        with tempfile.TemporaryDirectory() as tmp:
            self._bm25.save(tmp, show_progress=False)
            for name in sorted(os.listdir(tmp)):
                with (
                    open(os.path.join(tmp, name), "rb") as f,
                    storage.atomic_output(join(uri, name)) as out,
                ):
                    out.write(f.read())

    @classmethod
    def load(cls, storage: Storage, uri: str, k1: float = 1.2, b: float = 0.75) -> BM25Retriever:
        out = cls(k1, b)
        with tempfile.TemporaryDirectory() as tmp:
            for info in storage.list_files(uri):
                with open(os.path.join(tmp, info.base_name), "wb") as f:
                    f.write(storage.read_bytes(join(uri, info.base_name)))
            out._bm25 = bm25s.BM25.load(tmp, show_progress=False)
        out._n_docs = int(out._bm25.scores["num_docs"])
        return out

    def _scores(self, tokens: list[str]) -> np.ndarray:
        assert self._bm25 is not None, "index() first"
        ids = self._bm25.get_tokens_ids(tokens)
        if not ids:  # no query term occurs in the collection
            return np.zeros(self._n_docs, dtype=np.float32)
        return self._bm25.get_scores_from_ids(ids)

    def scores(self, queries: Sequence[str]) -> np.ndarray:
        """(n_q, N) scores of every indexed document, for callers that mask before ranking
        (candidate pooling filters by date inside the search, so no query runs short)."""
        out = np.zeros((len(queries), self._n_docs), dtype=np.float32)
        for i, tokens in enumerate(self._tokens(queries)):  # bm25s scores one query at a time
            out[i] = self._scores(tokens)
        return out

    def score(self, queries: Sequence[str], pools: np.ndarray) -> np.ndarray:
        out = np.full(pools.shape, -np.inf, dtype=np.float32)
        for i, tokens in enumerate(self._tokens(queries)):
            valid = pools[i] != PAD
            out[i, valid] = self._scores(tokens)[pools[i, valid]]
        return out

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        k = min(k, self._n_docs)
        idx = np.zeros((len(queries), k), dtype=np.int64)
        val = np.zeros((len(queries), k), dtype=np.float32)
        for i, tokens in enumerate(self._tokens(queries)):
            top, scores = top_k_rows(self._scores(tokens)[None, :], k)
            idx[i], val[i] = top[0], scores[0]
        return idx, val
