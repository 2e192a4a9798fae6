"""A faiss index searched by int64 ids, saved on object storage as Parquet and JSON.

Every vector carries an id (an S2 corpus id, or a position) and search returns ids, so no caller
keeps a position -> id table beside the index. Kinds are faiss ``index_factory`` strings:
``Flat`` (exact) or ``IVF{lists},Flat`` (inverted lists, ``nprobe`` of them searched per query).

Saved as the vectors themselves, readable by anything that reads Parquet: ``vectors.parquet``
(``id`` int64, ``embedding`` fixed_size_list<float32>) and, written last so that it marks a
complete save, ``index.json`` (factory string, metric, nprobe). Loading rebuilds the index from
them; training sees the same vectors in the same order and faiss seeds its k-means, so a loaded
index answers as the saved one did. Never pickle. :func:`save_vectors` writes that form without
building an index first (a stage that assembles vectors for indexes that its search actors load);
:func:`save_vector_chunks` writes it a run of vectors at a time (`cpr index`'s shards).

A search can be restricted to some rows (``allowed``, a boolean mask over the index's rows): the
mask becomes a faiss bitmap selector, so the restriction happens inside the scan and a filtered
search still returns k rows whenever k rows are allowed (an IVF index that finds fewer in its
probed lists is searched again over all of them). faiss holds the vectors by position, which is
what the bitmap addresses; positions are mapped to ids in NumPy.

``factory_for`` picks Flat below a size and IVF above it; ``device="auto"`` copies the index to
every GPU faiss sees (a faiss-gpu build), keeping the CPU index for the deep searches a GPU index
cannot answer (more than ``GPU_MAX_K`` neighbours).
"""

from __future__ import annotations

from collections.abc import Iterable
from math import isqrt

import numpy as np
import pyarrow as pa

from cpr_ray.storage.store import Storage, join

METRICS = ("inner_product", "l2")
VECTORS, META = "vectors.parquet", "index.json"
FORMAT = 1
GPU_MAX_K = 2048  # faiss GPU indexes return at most this many neighbours per query
MIN_POINTS_PER_LIST = 39  # faiss warns when k-means has fewer training points per centroid


def factory_for(n: int, ivf_min_vectors: int, lists: int | None = None) -> str:
    """Flat (exact) below `ivf_min_vectors` vectors, else ``IVF{lists},Flat``.

    Flat search costs O(n) per query, fine up to about a million vectors on a GPU; above that an
    inverted file searches a few lists only. `lists` defaults to 4·√n (faiss's guideline), and is
    capped so that k-means sees enough points per list.
    """
    if n < ivf_min_vectors:
        return "Flat"
    wanted = lists or 4 * isqrt(n)
    return f"IVF{max(1, min(wanted, n // MIN_POINTS_PER_LIST))},Flat"


def save_vectors(
    storage: Storage,
    uri: str,
    ids: np.ndarray,
    vectors: np.ndarray,
    factory: str = "Flat",
    metric: str = "inner_product",
    nprobe: int = 1,
) -> None:
    """Write an index's saved form (``vectors.parquet``, then ``index.json``) at `uri`."""
    dim = int(np.asarray(vectors).shape[1])
    save_vector_chunks(storage, uri, [(ids, vectors)], dim, factory, metric, nprobe)


def save_vector_chunks(
    storage: Storage,
    uri: str,
    chunks: Iterable[tuple[np.ndarray, np.ndarray]],
    dim: int,
    factory: str = "Flat",
    metric: str = "inner_product",
    nprobe: int = 1,
) -> None:
    """The saved form of an index whose (ids, vectors) come a run at a time, each run one row
    group of ``vectors.parquet``: whoever assembles it holds one run, never the whole index (and
    a later reader can fetch the row groups that hold some ids)."""
    schema = pa.schema([("id", pa.int64()), ("embedding", pa.list_(pa.float32(), dim))])
    tables = (
        pa.table(
            [
                pa.array(np.asarray(ids, dtype=np.int64), type=pa.int64()),
                pa.FixedSizeListArray.from_arrays(
                    pa.array(np.ascontiguousarray(vectors, np.float32).reshape(-1)), dim
                ),
            ],
            schema=schema,
        )
        for ids, vectors in chunks
    )
    storage.write_parquet_stream(tables, join(uri, VECTORS), schema)
    meta = {"format": FORMAT, "factory": factory, "metric": metric}
    storage.write_json(join(uri, META), {**meta, "nprobe": nprobe, "dim": dim})


def faiss_gpus(required: bool = True) -> int:
    """The GPUs the installed faiss build sees. `required`: none is an error naming the image to
    run, for a process that asked Ray for a GPU to search on: faiss-cpu would search on the CPU
    without a word, at a fraction of the speed the plan was sized for."""
    import faiss

    gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    if required and gpus == 0:
        raise ValueError(
            "device cuda: this faiss build sees no GPU; on a cluster, GPU workers run the gpu "
            "image (infra/image/Dockerfile --target gpu, cpr-ray:COMMIT-gpu, faiss's CUDA build), "
            "elsewhere install cpr-ray[gpu] instead of cpr-ray[cpu]"
        )
    return gpus


class VectorIndex:
    def __init__(
        self,
        ids: np.ndarray,
        vectors: np.ndarray,
        factory: str = "Flat",
        metric: str = "inner_product",
        nprobe: int = 1,
        device: str = "cpu",
    ) -> None:
        import faiss

        self.ids = np.asarray(ids, dtype=np.int64)
        self.vectors = np.ascontiguousarray(vectors, dtype=np.float32)  # (n, d)
        if self.vectors.ndim != 2 or len(self.ids) != len(self.vectors):
            raise ValueError(f"need one id per vector: {self.ids.shape} ids, {vectors.shape}")
        if len(np.unique(self.ids)) != len(self.ids):
            raise ValueError("vector ids must be unique")
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")
        self.factory, self.metric, self.nprobe = factory, metric, nprobe
        faiss_metric = faiss.METRIC_INNER_PRODUCT if metric == "inner_product" else faiss.METRIC_L2
        self._index = faiss.index_factory(self.dim, factory, faiss_metric)
        if not self._index.is_trained:
            self._index.train(self.vectors)
        self._index.add(self.vectors)
        self._ivf = faiss.try_extract_index_ivf(self._index)
        if self._ivf is not None:
            self._ivf.nprobe = nprobe
        self._gpu = None
        gpus = faiss_gpus() if device == "cuda" else faiss_gpus(required=False)
        if device in ("auto", "cuda") and gpus > 0:
            self._gpu = faiss.index_cpu_to_all_gpus(self._index)

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def __len__(self) -> int:
        return len(self.ids)

    def search(
        self, queries: np.ndarray, k: int, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Ids (n_q, k) int64 and scores (n_q, k) float32, best first; id -1 past what was found.

        Scores are inner products, or squared L2 distances (smallest first) for ``l2``.
        `allowed` (bool, one per row) restricts every query to those rows.
        """
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if allowed is None:
            index = self._gpu if self._gpu is not None and k <= GPU_MAX_K else self._index
            scores, rows = index.search(queries, k)
        else:
            scores, rows = self._search_allowed(queries, k, allowed)
        ids = np.where(rows >= 0, self.ids[np.maximum(rows, 0)], -1) if len(self) else rows
        return ids, scores

    def _search_allowed(
        self, queries: np.ndarray, k: int, allowed: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        import faiss

        allowed = np.asarray(allowed, dtype=bool)
        if allowed.shape != (len(self),):
            raise ValueError(f"allowed must have one entry per row ({len(self)}), {allowed.shape}")
        bits = np.packbits(allowed, bitorder="little")
        selector = faiss.IDSelectorBitmap(len(allowed), faiss.swig_ptr(bits))
        # faiss's stub types SearchParameters*() without the keyword arguments its wrapper
        # accepts (faiss/__init__.py: class_wrappers.handle_SearchParameters), which also keeps
        # the selector referenced; hence the ignores below
        if self._ivf is None:  # the CPU index: GPU indexes take no selector
            scores, rows = self._index.search(
                queries,
                k,
                params=faiss.SearchParameters(sel=selector),  # type: ignore[call-arg]
            )
            return scores, rows
        params = faiss.SearchParametersIVF(sel=selector, nprobe=self.nprobe)  # type: ignore[call-arg]
        scores, rows = self._index.search(queries, k, params=params)
        short = (rows < 0).sum(axis=1) > max(0, k - int(allowed.sum()))
        if short.any():  # the probed lists held too few allowed rows: probe every list
            everything = faiss.SearchParametersIVF(sel=selector, nprobe=self._ivf.nlist)  # type: ignore[call-arg]
            s2, r2 = self._index.search(np.ascontiguousarray(queries[short]), k, params=everything)
            scores[short], rows[short] = s2, r2
        return scores, rows

    def save(self, storage: Storage, uri: str) -> None:
        save_vectors(storage, uri, self.ids, self.vectors, self.factory, self.metric, self.nprobe)

    @classmethod
    def load(cls, storage: Storage, uri: str, device: str = "cpu") -> VectorIndex:
        storage.check(join(uri, META), must_exist=True)
        meta = storage.read_json(join(uri, META))
        if meta.get("format") != FORMAT:
            raise ValueError(f"{uri}: index format {meta.get('format')!r}, expected {FORMAT}")
        table = storage.read_parquet(join(uri, VECTORS))
        values = table.column("embedding").combine_chunks().flatten()
        vectors = values.to_numpy(zero_copy_only=False).reshape(-1, meta["dim"])
        ids = table.column("id").to_numpy()
        return cls(ids, vectors, meta["factory"], meta["metric"], meta["nprobe"], device)
