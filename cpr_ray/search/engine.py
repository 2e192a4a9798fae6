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

An index with a BM25 side beside the dense one (`cpr index` builds it unless ``--no-bm25``) is
searched hybrid by default: the dense and BM25 rankings, each filtered by the same mask before
it is ranked (a paper a filter drops is in neither, so it cannot return through the other) and
each ``fusion.depth`` deep, fused by `cpr_ray.retrieval.fusion.Fusion`, the fusion `cpr eval
--retriever hybrid` measures; a hit's score is then its fused score. ``retriever`` "dense" or
"bm25" searches one side. Every hit carries its rank on each side searched (``dense_rank``,
``bm25_rank``; null where it was not in that side's fused depth or the side was not searched).
An index built without BM25 searches dense only, and :attr:`SearchIndex.notice` says how to add
it. A query that names papers to leave out (``excluded_ids``: a CPR-eval query's own base paper)
has them dropped from each side before its cut, as `cpr eval` drops them.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.errors import ConfigError, InputError
from cpr_ray.retrieval.base import top_k_rows
from cpr_ray.retrieval.faiss_index import VectorIndex
from cpr_ray.retrieval.fusion import Fusion
from cpr_ray.retrieval.model_source import locate
from cpr_ray.retrieval.spec import EncoderSpec, with_identity
from cpr_ray.search.sharded_index import require_index
from cpr_ray.storage.store import Storage, StorageError, join

HIT_COLUMNS = ("corpus_id", "title", "year", "field", "domain")
SCAN_FLOATS = 1 << 25  # scores held at once by a one-scan search (128 MiB)
LEXICAL_CHUNK = 32  # queries BM25 scores at once: 32 x N floats (128 MiB at 1M papers)
NO_BM25 = (
    "this index has no BM25 side: searching dense only. Add it by running cpr index again with "
    "the same --corpus and --out (vectors are reused, BM25 is built beside)"
)


@dataclass(frozen=True)
class Query:
    """One research problem to search with. A blank one is refused here, where every query is
    made (`cpr search`'s argument or file, the service's request), so the command and the
    service refuse it alike: searching with nothing ranks papers by no question at all."""

    query_id: str
    query: str
    excluded_ids: tuple[Any, ...] = ()  # papers never returned (the query's own)

    def __post_init__(self) -> None:
        if not self.query.strip():
            raise InputError(
                f'query {self.query_id} is empty: ask a research problem, e.g. "How to …"'
            )


@dataclass(frozen=True)
class SearchOptions:
    """One search's settings: the `search:` section's by its names (`search_options` derives
    them), the request's filters and the `fusion:` section's fusion."""

    k: int = 10
    other_fields_only: bool = False
    field: str | None = None  # the query's own field (else inferred when needed)
    exclude_fields: tuple[str, ...] = ()
    before: int | None = None  # only papers published before this year
    # hybrid, dense or bm25; None: hybrid where the index has both sides, else dense
    retriever: Literal["hybrid", "dense", "bm25"] | None = None
    infer_field_k: int = 20
    fusion: Fusion = Fusion()

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
    unknown = sorted(set(enc) - set(EncoderSpec.model_fields))
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

    def lexical(
        self, texts: Sequence[str], k: int, allowed: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """BM25's rows (n_q, k) and scores, best first, equal scores to the lower row (as
        `BM25Retriever.search`); row -1 where fewer than k papers share a term with the query
        (a score of 0 is no match)."""
        parts = []
        for c in range(0, len(texts), LEXICAL_CHUNK):  # (chunk, N) scores at a time
            scores = self.bm25.scores(texts[c : c + LEXICAL_CHUNK])  # filtered before ranking
            if allowed is not None:
                scores[:, ~allowed] = -np.inf
            parts.append(top_k_rows(scores, k))
        if not parts:
            return np.zeros((0, k), np.int64), np.zeros((0, k), np.float32)
        rows, best = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        return np.where(best > 0, rows, -1), best

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

    @property
    def notice(self) -> str | None:
        """One line for an index built without BM25 (before hybrid became the default)."""
        return None if self.bm25 is not None else NO_BM25

    def retriever(self, asked: str | None) -> str:
        """What a search runs: the side(s) asked for, or hybrid where the index has both."""
        if asked is None:
            return "dense" if self.bm25 is None else "hybrid"
        if asked != "dense" and self.bm25 is None:
            raise ConfigError(
                f"{asked} search needs a BM25 index beside the dense one, and this index was "
                "built without it: run cpr index again with the same --corpus and --out"
            )
        return asked

    def search(
        self, queries: Sequence[Query], opts: SearchOptions, vectors: np.ndarray | None = None
    ) -> list[dict[str, Any]]:
        """One result per query: its field (when known or needed), filters and hits."""
        mode = self.retriever(opts.retriever)
        needs_fields = opts.other_fields_only or opts.exclude_fields
        if needs_fields and not self.manifest.get("has_fields", True):
            raise InputError(
                "this index's corpus has no fields (a BEIR corpus): field filters do not apply"
            )
        inferred = opts.other_fields_only and opts.field is None
        q = vectors
        if q is None and (mode != "bm25" or inferred):
            q = self.encode([x.query for x in queries])
        own: list[str | None] = [opts.field] * len(queries)
        source = "given" if opts.field else None
        one_scan = inferred and mode == "dense" and self.exact
        drop = [self.rows_of(x.excluded_ids) for x in queries]
        extra = max(map(len, drop), default=0)
        hits: list[list[tuple[int, float, int | None, int | None]]] = [[] for _ in queries]
        groups: dict[frozenset[str], list[int]] = defaultdict(list)
        if one_scan:
            assert q is not None  # encoded above: every mode but BM25, or fields inferred
            own, found = self._inferred_one_scan(q, replace(opts, k=opts.k + extra))
            source = "inferred"
            for i, h in enumerate(found):
                kept = [(r, s) for r, s in h if r not in drop[i]][: opts.k]
                hits[i] = [(r, s, n, None) for n, (r, s) in enumerate(kept, start=1)]
        elif inferred:
            assert q is not None
            own, source = self.infer_fields(q, opts.infer_field_k), "inferred"
        for i, f in enumerate([] if one_scan else own):
            skipped = set(opts.exclude_fields)
            if opts.other_fields_only and f is not None:
                skipped.add(f)
            groups[frozenset(skipped)].append(i)
        for excluded, members in groups.items():
            allowed = self.mask(excluded, opts.before)
            texts = [queries[i].query for i in members]
            if mode == "hybrid":
                assert q is not None
                fetch = opts.fusion.side_depth(opts.k) + extra
                d_rows, d_scores = self.dense(q[members], fetch, allowed)
                b_rows, b_scores = self.lexical(texts, fetch, allowed)
                for n, i in enumerate(members):
                    sides = opts.fusion.sides(
                        d_rows[n].tolist(),
                        d_scores[n],
                        b_rows[n].tolist(),
                        b_scores[n],
                        opts.k,
                        drop[i],
                    )
                    fused = opts.fusion.fuse(*sides, top_n=opts.k)
                    hits[i] = [(f.doc, f.score, f.dense_rank, f.bm25_rank) for f in fused]
                continue
            if mode == "dense":
                assert q is not None
                rows, scores = self.dense(q[members], opts.k + extra, allowed)
            else:
                rows, scores = self.lexical(texts, opts.k + extra, allowed)
            for i, rr, ss in zip(members, rows, scores):
                kept = [(int(r), float(s)) for r, s in zip(rr, ss) if r >= 0 and r not in drop[i]]
                ranked = enumerate(kept[: opts.k], start=1)
                hits[i] = [
                    (r, s, n if mode == "dense" else None, n if mode == "bm25" else None)
                    for n, (r, s) in ranked
                ]
        return [
            {
                "query_id": x.query_id,
                "query": x.query,
                "query_field": own[i] if (opts.other_fields_only or opts.field) else None,
                "query_field_source": source if (opts.other_fields_only or opts.field) else None,
                "retriever": mode,
                "fusion": opts.fusion.describe() if mode == "hybrid" else None,
                "filters": opts.filters(),
                "excluded_ids": list(x.excluded_ids),
                "hits": [
                    self.hit(r, s, n, d, b) for n, (r, s, d, b) in enumerate(hits[i], start=1)
                ],
            }
            for i, x in enumerate(queries)
        ]

    def hit(
        self,
        row: int,
        score: float,
        rank: int,
        dense_rank: int | None = None,
        bm25_rank: int | None = None,
    ) -> dict[str, Any]:
        c = self.columns
        return {
            "rank": rank,
            "corpus_id": c["corpus_id"][row],
            "score": round(float(score), 6),
            "dense_rank": dense_rank,
            "bm25_rank": bm25_rank,
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
        return self._row_by_id_map()[corpus_id]

    def rows_of(self, corpus_ids: Sequence[Any]) -> set[int]:
        """The rows of those of `corpus_ids` the index holds (an id given as text or as a
        number alike: a JSON file may write an S2 id either way)."""
        if not corpus_ids:
            return set()
        by_id = self._row_by_id_map()
        out = set()
        for d in corpus_ids:
            for key in (d, str(d), int(d) if str(d).isdigit() else None):
                if key in by_id:
                    out.add(by_id[key])
                    break
        return out

    def _row_by_id_map(self) -> dict[Any, int]:
        if not hasattr(self, "_row_by_id"):
            self._row_by_id = {d: i for i, d in enumerate(self.columns["corpus_id"])}
        return self._row_by_id


__all__ = ["Query", "SearchIndex", "SearchOptions", "majority_field", "merge_top_k"]
