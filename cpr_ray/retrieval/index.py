"""A faiss index searched by int64 ids, saved on object storage as Parquet and JSON.

Every vector carries an id (an S2 corpus id, or a position) and search returns ids, so no caller
keeps a position -> id table beside the index. Kinds are faiss ``index_factory`` strings:
``Flat`` (exact) or ``IVF{lists},Flat`` (inverted lists, ``nprobe`` of them searched per query).

Saved as the vectors themselves, readable by anything that reads Parquet: ``vectors.parquet``
(``id`` int64, ``embedding`` fixed_size_list<float32>) and, written last so that it marks a
complete save, ``index.json`` (factory string, metric, nprobe). Loading rebuilds the index from
them; training sees the same vectors in the same order and faiss seeds its k-means, so a loaded
index answers as the saved one did. Never pickle.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from cpr_ray.storage import Storage, join

METRICS = ("inner_product", "l2")
VECTORS, META = "vectors.parquet", "index.json"
FORMAT = 1


class VectorIndex:
    def __init__(
        self,
        ids: np.ndarray,
        vectors: np.ndarray,
        factory: str = "Flat",
        metric: str = "inner_product",
        nprobe: int = 1,
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
        self._index = faiss.index_factory(self.dim, f"IDMap2,{factory}", faiss_metric)
        if not self._index.is_trained:
            self._index.train(self.vectors)
        self._index.add_with_ids(self.vectors, self.ids)
        ivf = faiss.try_extract_index_ivf(self._index)
        if ivf is not None:
            ivf.nprobe = nprobe

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def __len__(self) -> int:
        return len(self.ids)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Ids (n_q, k) int64 and scores (n_q, k) float32, best first; id -1 past what was found.

        Scores are inner products, or squared L2 distances (smallest first) for ``l2``.
        """
        scores, ids = self._index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
        return ids, scores

    def save(self, storage: Storage, uri: str) -> None:
        flat = pa.array(self.vectors.reshape(-1), type=pa.float32())
        table = pa.table(
            {
                "id": pa.array(self.ids, type=pa.int64()),
                "embedding": pa.FixedSizeListArray.from_arrays(flat, self.dim),
            }
        )
        storage.write_parquet(table, join(uri, VECTORS))
        meta = {"format": FORMAT, "factory": self.factory, "metric": self.metric}
        storage.write_json(join(uri, META), {**meta, "nprobe": self.nprobe, "dim": self.dim})

    @classmethod
    def load(cls, storage: Storage, uri: str) -> VectorIndex:
        storage.check(join(uri, META), must_exist=True)
        meta = storage.read_json(join(uri, META))
        if meta.get("format") != FORMAT:
            raise ValueError(f"{uri}: index format {meta.get('format')!r}, expected {FORMAT}")
        table = storage.read_parquet(join(uri, VECTORS))
        values = table.column("embedding").combine_chunks().flatten()
        vectors = values.to_numpy(zero_copy_only=False).reshape(-1, meta["dim"])
        ids = table.column("id").to_numpy()
        return cls(ids, vectors, meta["factory"], meta["metric"], meta["nprobe"])
