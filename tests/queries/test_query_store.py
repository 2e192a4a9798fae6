"""The store of query vectors behind synthesize-queries' Q-D metrics (`queries.query_store`)."""

from __future__ import annotations

import numpy as np

from cpr_ray.config import load_config
from cpr_ray.queries.query_store import query_store, stored
from cpr_ray.retrieval.spec import EncoderSpec
from cpr_ray.storage.store import Storage


def _encoder(calls: list[list[str]]):
    """A stand-in for the model: a text's vector is a function of the text, calls recorded."""

    def encode(texts: list[str]) -> np.ndarray:
        calls.append(list(texts))
        rows = [[len(t), sum(map(ord, t)) % 97, 1.0] for t in texts]
        return np.array(rows, dtype=np.float32).reshape(len(texts), 3)

    return encode


def test_a_later_run_encodes_only_texts_no_earlier_run_encoded(storage):
    spec = EncoderSpec(model="org/query-encoder")
    calls: list[list[str]] = []
    first = stored(storage, spec, _encoder(calls))(["a b", "c d e", "a b"])
    assert calls == [["a b", "c d e"]]
    # another run (a new function over the same store): only the new text is encoded
    second = stored(storage, spec, _encoder(calls))(["c d e", "f", "a b"])
    assert calls == [["a b", "c d e"], ["f"]]
    fresh = _encoder([])
    assert np.array_equal(first, fresh(["a b", "c d e", "a b"]))
    assert np.array_equal(second, fresh(["c d e", "f", "a b"]))
    assert stored(storage, spec, _encoder(calls))([]).shape == (0, 3)


def test_a_vector_changing_setting_is_another_store(tmp_path):
    storage = Storage(load_config(env={}, overrides=[f"storage.root={tmp_path}"]).storage)
    plain = EncoderSpec(model="org/query-encoder")
    prefixed = EncoderSpec(model="org/query-encoder", query_prefix="query: ")
    assert query_store(storage, plain).uri != query_store(storage, prefixed).uri
    assert (
        query_store(storage, plain).uri != query_store(storage, EncoderSpec(model="org/other")).uri
    )
    calls: list[list[str]] = []
    stored(storage, plain, _encoder(calls))(["x"])
    stored(storage, prefixed, _encoder(calls))(["x"])
    assert calls == [["x"], ["x"]]
