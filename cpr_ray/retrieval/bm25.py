"""BM25 with bm25s: Lucene variant, k1 = 1.2, b = 0.75, English stop words and Snowball stemming.

Statistics (IDF, average length) come from the indexed documents: the corpus, or for pooled
benchmarks the union of all pools. A collection indexed in parts (candidate pooling's shards)
gives each part the whole collection's statistics instead (:class:`CollectionStats`, summed over
the parts), and each part then scores its documents exactly as one index over all of them does.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import bm25s
import numpy as np
import scipy.sparse as sp
import Stemmer
from bm25s.scoring import (
    _build_idf_array,
    _build_scores_and_indices_for_matrix,
    _calculate_doc_freqs,
    _score_idf_lucene,
)

from cpr_ray.errors import InputError
from cpr_ray.retrieval.base import PAD, top_k_rows
from cpr_ray.storage.store import Storage, join


class EmptyVocabulary(InputError):
    """No document of a collection has a term BM25 can index."""


@dataclass(frozen=True)
class CollectionStats:
    """What a BM25 score takes from the whole collection: its number of documents, their total
    length in terms, and the document frequency of the terms it is searched for (the queries'
    terms: a table bounded by the queries, not by the collection's vocabulary)."""

    documents: int
    length: int
    df: Mapping[str, int]

    @classmethod
    def total(cls, parts: Iterable[CollectionStats]) -> CollectionStats:
        """The statistics of a collection from those of its disjoint parts."""
        documents, length = 0, 0
        df: dict[str, int] = {}
        for p in parts:
            documents, length = documents + p.documents, length + p.length
            for term, n in p.df.items():
                df[term] = df.get(term, 0) + n
        return cls(documents, length, df)

    def as_dict(self) -> dict:
        return {"documents": self.documents, "length": self.length, "df": dict(self.df)}

    @classmethod
    def from_dict(cls, d: Mapping) -> CollectionStats:
        return cls(int(d["documents"]), int(d["length"]), {t: int(n) for t, n in d["df"].items()})


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

    def _token_ids(self, texts: Sequence[str]) -> bm25s.tokenization.Tokenized:
        return bm25s.tokenize(
            list(texts), lower=True, stopwords="en", stemmer=self._stemmer, show_progress=False
        )

    def terms(self, queries: Sequence[str]) -> list[str]:
        """The distinct terms of `queries`, as a search looks them up (sorted)."""
        return sorted(set(itertools.chain.from_iterable(self._tokens(queries))))

    def statistics(self, texts: Sequence[str], terms: Sequence[str]) -> CollectionStats:
        """`texts`' part of a collection's statistics, the document frequency of `terms` only."""
        tokens = self._token_ids(texts)
        lengths = np.fromiter(map(len, tokens.ids), np.int64, len(tokens.ids))
        ids = np.fromiter(itertools.chain.from_iterable(tokens.ids), np.int64, int(lengths.sum()))
        counts = sp.csr_matrix(
            (np.ones(len(ids), np.int32), ids, np.r_[0, np.cumsum(lengths)]),
            shape=(len(lengths), max(1, len(tokens.vocab))),
        )
        counts.sum_duplicates()  # a term once per document
        df = counts.getnnz(axis=0)
        found = {t: int(df[tokens.vocab[t]]) for t in terms if t in tokens.vocab}
        return CollectionStats(len(lengths), int(lengths.sum()), found)

    def index(self, texts: Sequence[str], stats: CollectionStats | None = None) -> None:
        """Index `texts`, with their own statistics or, for a part of a larger collection, with
        the collection's `stats` (then only the terms of `stats.df` can be searched for: the
        others score 0). A document with no indexable term scores 0 for every query; texts with
        none at all are refused: every score would be 0 and every ranking a tie, figures that
        look like results and measure nothing."""
        tokens = self._token_ids(texts)
        if not tokens.vocab:  # bm25s itself fails on it with "max() arg is an empty sequence"
            raise EmptyVocabulary(
                f"BM25: none of the {len(texts):,} documents has a word to index (each is empty, "
                "English stop words or one-letter tokens)"
            )
        self._bm25 = bm25 = bm25s.BM25(k1=self.k1, b=self.b, method="lucene")
        if stats is None:
            bm25.index(tokens, show_progress=False)
        else:
            self._index_with(bm25, tokens, stats)
        self._n_docs = len(texts)

    def _index_with(
        self, bm25: bm25s.BM25, tokens: bm25s.tokenization.Tokenized, stats: CollectionStats
    ) -> None:
        """bm25s's own index steps (`BM25.build_index_from_ids`), fed the collection's number
        of documents, average length and document frequencies instead of these documents':
        the same functions on the same values, so each (term, document) score is bit for bit
        the one an index over the whole collection holds, and so is each query's sum."""
        vocab = tokens.vocab
        local = _calculate_doc_freqs(tokens.ids, vocab.values(), show_progress=False)
        idf = _build_idf_array(
            {i: stats.df.get(term, 0) for term, i in vocab.items()},
            n_docs=stats.documents,
            compute_idf_fn=_score_idf_lucene,
            dtype=bm25.dtype,
        )
        # np.float64, as bm25s's own mean is: a Python float would round the scores to float32
        average = np.float64(stats.length) / np.float64(stats.documents)
        scores, docs, terms = _build_scores_and_indices_for_matrix(
            tokens.ids,
            idf,
            average,
            local,  # only its sum is read: the number of (term, document) entries here
            bm25.k1,
            bm25.b,
            bm25.delta,
            nonoccurrence_array=None,  # Lucene's variant has none
            method=bm25.method,
            dtype=bm25.dtype,
            int_dtype=bm25.int_dtype,
            show_progress=False,
        )
        data, indices, indptr = bm25._np_csc(scores, docs, terms, (len(tokens.ids), len(vocab)))
        bm25.scores = {
            "data": data.astype(bm25.dtype),
            "indices": indices,
            "indptr": indptr,
            "num_docs": len(tokens.ids),
        }
        bm25.vocab_dict, bm25.nonoccurrence_array = dict(vocab), None
        bm25.unique_token_ids_set = set(vocab.values())

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
