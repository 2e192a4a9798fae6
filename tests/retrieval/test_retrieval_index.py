"""The faiss index: search by ids, IVF against Flat, and save -> load on local paths and S3."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from cpr_ray.retrieval import top_k_rows
from cpr_ray.retrieval.faiss_index import VectorIndex
from cpr_ray.storage.store import Storage, StorageConfig, StorageError


def unit_vectors(n: int, d: int = 16, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


IDS = np.arange(400, dtype=np.int64) * 7 + 1_000_000_000  # S2-like corpus ids, not positions
VECTORS = unit_vectors(400)
QUERIES = unit_vectors(20, seed=1)


def test_flat_search_returns_ids_of_the_exact_top_k():
    index = VectorIndex(IDS, VECTORS)
    ids, scores = index.search(QUERIES, 5)
    positions, expected = top_k_rows(QUERIES @ VECTORS.T, 5)
    assert ids.dtype == np.int64 and ids.tolist() == IDS[positions].tolist()
    np.testing.assert_allclose(scores, expected, atol=1e-5)
    assert len(index) == 400 and index.dim == 16
    ids, _ = VectorIndex(IDS[:3], VECTORS[:3]).search(QUERIES[:1], 5)
    assert ids[0, 3:].tolist() == [-1, -1]  # fewer vectors than k


def test_ivf_with_every_list_probed_is_exact():
    flat_ids, flat_scores = VectorIndex(IDS, VECTORS).search(QUERIES, 10)
    ivf = VectorIndex(IDS, VECTORS, "IVF8,Flat", nprobe=8)
    ids, scores = ivf.search(QUERIES, 10)
    assert ids.tolist() == flat_ids.tolist()
    np.testing.assert_allclose(scores, flat_scores, atol=1e-5)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="unique"):
        VectorIndex(np.zeros(2, np.int64), VECTORS[:2])
    with pytest.raises(ValueError, match="one id per vector"):
        VectorIndex(IDS[:3], VECTORS[:2])
    with pytest.raises(ValueError, match="unknown metric 'cosine'"):
        VectorIndex(IDS, VECTORS, metric="cosine")


def _round_trip(storage: Storage, uri: str) -> None:
    for factory, metric, nprobe in [("Flat", "inner_product", 1), ("IVF8,Flat", "l2", 2)]:
        where = f"{uri}/{factory.replace(',', '-')}"
        saved = VectorIndex(IDS, VECTORS, factory, metric, nprobe)
        saved.save(storage, where)
        table = storage.read_parquet(f"{where}/vectors.parquet")
        assert table.schema.field("id").type == pa.int64()
        assert table.schema.field("embedding").type == pa.list_(pa.float32(), 16)
        assert storage.read_json(f"{where}/index.json")["factory"] == factory
        loaded = VectorIndex.load(storage, where)
        assert (loaded.factory, loaded.metric, loaded.nprobe) == (factory, metric, nprobe)
        for got, want in zip(loaded.search(QUERIES, 10), saved.search(QUERIES, 10)):
            np.testing.assert_array_equal(got, want)


def test_save_load_round_trip_local(tmp_path):
    storage = Storage(StorageConfig(root=str(tmp_path)))
    _round_trip(storage, str(tmp_path / "index"))
    with pytest.raises(StorageError, match="does not exist"):
        VectorIndex.load(storage, str(tmp_path / "nothing-here"))


def test_save_load_round_trip_s3(s3_endpoint, s3_bucket):
    storage = Storage(StorageConfig(root=f"s3://{s3_bucket}", s3_endpoint=s3_endpoint))
    _round_trip(storage, f"s3://{s3_bucket}/indexes/dense")
