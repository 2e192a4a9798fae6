"""Searching an index: query vectors against every shard, filters inside the scan, metadata out.

Filters are masks over the index's rows (the field and year columns of ``docs.parquet``) applied
while the shards are scanned, so a filtered search returns k hits whenever k documents pass the
filter; no over-fetch guess can run short. Flat (exact) shards are scanned by one BLAS product
of a chunk of queries with the shard's vectors, the mask applied to the scores before the top k;
IVF shards are searched by faiss with the mask as a bitmap selector.

``--other-fields-only`` needs the query's own field: given, or the majority field of its
``infer_field_k`` nearest papers (their summed scores break ties), and each result says which it
was. Over exact shards one scan gives both the nearest papers and the filtered hits; otherwise
queries that exclude the same fields share one masked search.

Hybrid search fuses the dense and BM25 rankings (each ``hybrid_depth`` deep, both filtered) by
reciprocal rank fusion; a hit's score is then its fused score.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.errors import ConfigError, InputError
from cpr_ray.retrieval.base import top_k_rows
from cpr_ray.retrieval.fusion import reciprocal_rank_fusion
from cpr_ray.retrieval.index import VectorIndex
from cpr_ray.retrieval.model_source import locate
from cpr_ray.retrieval.spec import EncoderSpec, with_identity
from cpr_ray.search.index import require_index
from cpr_ray.storage import Storage, StorageError, join

HIT_COLUMNS = ("corpus_id", "title", "year", "field", "domain")
SCAN_FLOATS = 1 << 25  # scores held at once by a one-scan search (128 MiB)


@dataclass(frozen=True)
class Query:
    """One research problem to search with. A blank one is refused here, where every query is
    made (`cpr search`'s argument or file, the service's request), so the command and the
    service refuse it alike: searching with nothing ranks papers by no question at all."""

    query_id: str
    query: str

    def __post_init__(self) -> None:
        if not self.query.strip():
            raise InputError(
                f'query {self.query_id} is empty: ask a research problem, e.g. "How to …"'
            )


@dataclass(frozen=True)
class SearchOptions:
    k: int = 10
    other_fields_only: bool = False
    field: str | None = None  # the query's own field (else inferred when needed)
    exclude_fields: tuple[str, ...] = ()
    before: int | None = None  # only papers published before this year
    hybrid: bool = False
    infer_field_k: int = 20
    hybrid_depth: int = 100

    def filters(self) -> dict[str, Any]:
        return {
            "other_fields_only": self.other_fields_only,
            "exclude_fields": list(self.exclude_fields),
            "before": self.before,
        }


def merge_top_k(
    rows: Sequence[np.ndarray], scores: Sequence[np.ndarray], k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per query, the k best of several shards' (n_q, k_i) results (row -1: nothing there)."""
    all_rows = np.concatenate(rows, axis=1)
    all_scores = np.where(all_rows >= 0, np.concatenate(scores, axis=1), -np.inf)
    k = min(k, all_rows.shape[1])
    order = np.argsort(-all_scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(all_rows, order, 1), np.take_along_axis(all_scores, order, 1)


def majority_field(fields: Sequence[str | None], scores: Sequence[float]) -> str | None:
    """The most frequent field among a query's nearest papers; ties go to the larger score sum."""
    count: Counter[str] = Counter()
    weight: dict[str, float] = defaultdict(float)
    for f, s in zip(fields, scores):
        if f is not None:
            count[f] += 1
            weight[f] += float(s)
    if not count:
        return None
    return max(count, key=lambda f: (count[f], weight[f]))


# a searcher with no `encoder:` settings of its own: the CPU, the spec's defaults
CPU_READER = EncoderSpec(model="", device="cpu")


def query_encoder_spec(manifest: dict[str, Any], uri: str, reader: EncoderSpec) -> EncoderSpec:
    """How the index at `uri` encodes queries: its manifest's encoder record (the
    `query_identity` of the spec it was built with), run as the `reader`'s spec says (device,
    batch size, loading settings). Its model is located now, so an index whose model folder has
    gone is one line before anything loads (`cpr search`, and `cpr serve` before a replica
    starts)."""
    enc = {k: v for k, v in manifest["encoder"].items() if k != "fingerprint"}
    unknown = sorted(set(enc) - {f.name for f in fields(EncoderSpec)})
    if unknown or "model" not in enc:
        raise StorageError(
            f"{uri}: its index.json records an encoder this version cannot read (keys "
            f"{', '.join(unknown) or 'without model'}): rebuild the index with this cpr index"
        )
    spec = with_identity(enc, reader, f"the model of the index {uri} (index.json)")
    locate(spec)
    return spec


@dataclass
class SearchIndex:
    manifest: dict[str, Any]
    docs: pa.Table
    shards: list[VectorIndex]
    spec: EncoderSpec
    bm25: Any = None
    _encoder: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.vids = self.docs["vid"].to_numpy()
        self.offsets = np.cumsum([0, *(len(s) for s in self.shards)])
        if self.offsets[-1] != self.docs.num_rows:
            raise StorageError("the index's shards and docs.parquet disagree on its size")
        self.columns = {c: self.docs[c].to_pylist() for c in HIT_COLUMNS}
        fields = pc.dictionary_encode(self.docs["field"].combine_chunks())
        self.field_names: list[str] = fields.dictionary.to_pylist()
        self.field_codes = pc.fill_null(fields.indices, -1).to_numpy(zero_copy_only=False)
        self.years = pc.fill_null(self.docs["year"], 10_000).to_numpy(zero_copy_only=False)
        self._masks: dict[tuple, np.ndarray | None] = {}

    @classmethod
    def load(cls, storage: Storage, uri: str, reader: EncoderSpec = CPU_READER) -> SearchIndex:
        """The index at `uri`; its queries are encoded as its manifest's encoder record says,
        run as the `reader`'s spec says (the searcher's `encoder:` section: device, batch size,
        loading settings: the searcher's own, never the index's, so reading an index runs no
        code its reader has not allowed)."""
        manifest = require_index(storage, uri)
        spec = query_encoder_spec(manifest, uri, reader)
        docs = storage.read_parquet(join(uri, manifest["docs"]))
        shards = [VectorIndex.load(storage, join(uri, s["path"])) for s in manifest["shards"]]
        bm25 = None
        if manifest["bm25"]:
            from cpr_ray.retrieval.bm25 import BM25Retriever

            bm25 = BM25Retriever.load(storage, join(uri, manifest["bm25"]))
        return cls(manifest, docs, shards, spec, bm25)

    def __len__(self) -> int:
        return self.docs.num_rows

    @property
    def encoder(self):
        if self._encoder is None:
            from cpr_ray.retrieval.encoder import DenseEncoder

            self._encoder = DenseEncoder(self.spec)
        return self._encoder

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return np.ascontiguousarray(self.encoder.encode_queries(list(texts)), dtype=np.float32)

    # -- filters ---------------------------------------------------------------------------

    def mask(self, exclude: frozenset[str], before: int | None) -> np.ndarray | None:
        """Rows a search may return; None: all of them."""
        key = (exclude, before)
        if key not in self._masks:
            allowed = None
            if exclude:
                codes = [i for i, f in enumerate(self.field_names) if f in exclude]
                allowed = ~np.isin(self.field_codes, codes) & (self.field_codes >= 0)
            if before is not None:
                by_year = self.years < before
                allowed = by_year if allowed is None else allowed & by_year
            self._masks[key] = allowed
        return self._masks[key]

    # -- retrieval -------------------------------------------------------------------------

    @property
    def exact(self) -> bool:
        return all(shard.factory == "Flat" for shard in self.shards)

    def _chunks(self, q: np.ndarray) -> Iterator[tuple[slice, list[tuple[np.ndarray, int, int]]]]:
        """Flat shards' scores, a chunk of queries at a time: (queries, [(scores (c, n_shard),
        first row, end row)]) — one BLAS product per shard and chunk, the work faiss's flat
        search does, without its per-query heaps (measured faster here: benchmarks/search.py)."""
        widest = max((len(s) for s in self.shards), default=1)
        chunk = max(1, SCAN_FLOATS // widest)
        spans = list(zip(self.shards, self.offsets[:-1], self.offsets[1:]))
        for c0 in range(0, len(q), chunk):
            qc = q[c0 : c0 + chunk]
            yield slice(c0, c0 + len(qc)), [(qc @ sh.vectors.T, a, b) for sh, a, b in spans]

    @staticmethod
    def _best(
        scored: list[tuple[np.ndarray, int, int]],
        k: int,
        allowed: np.ndarray | None = None,
        exclude: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The k best rows of chunk scores, masked in place: `allowed` over all rows, `exclude`
        (each query's field code, the rows' codes) drops a query's own field."""
        rows, scores = [], []
        for s, start, end in scored:
            if allowed is not None:
                s[:, ~allowed[start:end]] = -np.inf
            if exclude is not None:
                own, codes = exclude
                s[codes[start:end][None, :] == own[:, None]] = -np.inf
            idx, val = top_k_rows(s, k)
            rows.append(np.where(np.isfinite(val), idx + start, -1))
            scores.append(val)
        return merge_top_k(rows, scores, k)

    def dense(
        self, q: np.ndarray, k: int, allowed: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows (n_q, k) into docs (-1: nothing) and inner products, best first."""
        if self.exact:
            parts = [self._best(scored, k, allowed) for _, scored in self._chunks(q)]
            if not parts:
                return np.zeros((0, k), np.int64), np.zeros((0, k), np.float32)
            return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        rows, scores = [], []
        for shard, start, end in zip(self.shards, self.offsets[:-1], self.offsets[1:]):
            part = None if allowed is None else allowed[start:end]
            if part is not None and not part.any():
                continue
            ids, s = shard.search(q, min(k, len(shard)), part)  # faiss, the mask as a selector
            at = np.searchsorted(self.vids, ids)
            rows.append(np.where(ids >= 0, at, -1))
            scores.append(s)
        if not rows:
            return np.full((len(q), 0), -1, np.int64), np.zeros((len(q), 0), np.float32)
        return merge_top_k(rows, scores, k)

    def lexical(self, texts: Sequence[str], k: int, allowed: np.ndarray | None) -> list[np.ndarray]:
        scores = self.bm25.scores(texts)  # (n_q, N): filtered before ranking, never after
        if allowed is not None:
            scores[:, ~allowed] = -np.inf
        k = min(k, scores.shape[1])
        top = (
            np.argpartition(-scores, k - 1, axis=1)[:, :k] if k else np.zeros((len(texts), 0), int)
        )
        out = []
        for i, row in enumerate(top):
            row = row[np.isfinite(scores[i, row])]
            out.append(row[np.argsort(-scores[i, row], kind="stable")])
        return out

    def _inferred_one_scan(
        self, q: np.ndarray, opts: SearchOptions
    ) -> tuple[list[str | None], list[list[tuple[int, float]]]]:
        """--other-fields-only with the field inferred, over exact shards: one product of the
        query vectors with each shard gives both the nearest papers (hence the field) and the
        filtered hits, where two searches would scan every shard twice."""
        base = self.mask(frozenset(opts.exclude_fields), opts.before)
        fields = self.columns["field"]
        code = {f: i for i, f in enumerate(self.field_names)}
        own: list[str | None] = []
        hits: list[list[tuple[int, float]]] = []
        for _, scored in self._chunks(q):
            rows, best = self._best(scored, opts.infer_field_k)  # unmasked: scores kept
            chunk_own = [
                majority_field([fields[r] for r in rr if r >= 0], ss[rr >= 0])
                for rr, ss in zip(rows, best)
            ]
            own_codes = np.array([code[f] if f is not None else -2 for f in chunk_own])
            rows, best = self._best(scored, opts.k, base, (own_codes, self.field_codes))
            own.extend(chunk_own)
            hits.extend(
                [(int(r), float(v)) for r, v in zip(rr, vv) if r >= 0] for rr, vv in zip(rows, best)
            )
        return own, hits

    def infer_fields(self, q: np.ndarray, k: int) -> list[str | None]:
        rows, scores = self.dense(q, k, None)
        fields = self.columns["field"]
        return [
            majority_field([fields[r] for r in rr if r >= 0], ss[rr >= 0])
            for rr, ss in zip(rows, scores)
        ]

    # -- the whole search ------------------------------------------------------------------

    def search(
        self, queries: Sequence[Query], opts: SearchOptions, vectors: np.ndarray | None = None
    ) -> list[dict[str, Any]]:
        """One result per query: its field (when known or needed), filters and hits."""
        if opts.hybrid and self.bm25 is None:
            raise ConfigError(
                "--hybrid needs a BM25 index beside the dense one: rebuild with "
                "cpr index … --set search.bm25=true"
            )
        needs_fields = opts.other_fields_only or opts.exclude_fields
        if needs_fields and not self.manifest.get("has_fields", True):
            raise InputError(
                "this index's corpus has no fields (a BEIR corpus): field filters do not apply"
            )
        q = self.encode([x.query for x in queries]) if vectors is None else vectors
        own: list[str | None] = [opts.field] * len(queries)
        source = "given" if opts.field else None
        inferred = opts.other_fields_only and opts.field is None
        one_scan = inferred and not opts.hybrid and self.exact
        hits: list[list[tuple[int, float]]] = [[] for _ in queries]
        groups: dict[frozenset[str], list[int]] = defaultdict(list)
        if one_scan:
            own, hits = self._inferred_one_scan(q, opts)
            source = "inferred"
        elif inferred:
            own, source = self.infer_fields(q, opts.infer_field_k), "inferred"
        for i, f in enumerate([] if one_scan else own):
            excluded = set(opts.exclude_fields)
            if opts.other_fields_only and f is not None:
                excluded.add(f)
            groups[frozenset(excluded)].append(i)
        for excluded, members in groups.items():
            allowed = self.mask(excluded, opts.before)
            if opts.hybrid:
                depth = max(opts.k, opts.hybrid_depth)
                d_rows, _ = self.dense(q[members], depth, allowed)
                lex = self.lexical([queries[i].query for i in members], depth, allowed)
                for i, dr, lr in zip(members, d_rows, lex):
                    fused = reciprocal_rank_fusion(
                        [dr[dr >= 0].tolist(), lr.tolist()], top_n=opts.k, with_scores=True
                    )
                    hits[i] = [(int(r), s) for r, s in fused]
            else:
                rows, scores = self.dense(q[members], opts.k, allowed)
                for i, rr, ss in zip(members, rows, scores):
                    hits[i] = [(int(r), float(s)) for r, s in zip(rr, ss) if r >= 0]
        return [
            {
                "query_id": x.query_id,
                "query": x.query,
                "query_field": own[i] if (opts.other_fields_only or opts.field) else None,
                "query_field_source": source if (opts.other_fields_only or opts.field) else None,
                "filters": opts.filters(),
                "hits": [self.hit(r, s, n) for n, (r, s) in enumerate(hits[i], start=1)],
            }
            for i, x in enumerate(queries)
        ]

    def hit(self, row: int, score: float, rank: int) -> dict[str, Any]:
        c = self.columns
        return {
            "rank": rank,
            "corpus_id": c["corpus_id"][row],
            "score": round(float(score), 6),
            "title": c["title"][row],
            "year": c["year"][row],
            "field": c["field"][row],
            "domain": c["domain"][row],
        }

    def text_of(self, corpus_id: Any) -> str:
        return self.docs["text"][self.row_of(corpus_id)].as_py()

    def abstract_of(self, corpus_id: Any) -> str | None:
        """A document's abstract, cut from the one paper text the index holds ("title.
        abstract", `schemas.paper_text`); None where it has none (the export withholds it by
        licence)."""
        text = self.text_of(corpus_id)
        title = (self.columns["title"][self.row_of(corpus_id)] or "").strip()
        if not title:
            return text or None
        for sep in (". ", " "):  # paper_text's: " " after a title ending in . ? or !
            if text.startswith(title + sep):
                return text[len(title) + len(sep) :] or None
        return None  # the title alone: no abstract

    def row_of(self, corpus_id: Any) -> int:
        if not hasattr(self, "_row_by_id"):
            self._row_by_id = {d: i for i, d in enumerate(self.columns["corpus_id"])}
        return self._row_by_id[corpus_id]


__all__ = ["Query", "SearchIndex", "SearchOptions", "majority_field", "merge_top_k"]
