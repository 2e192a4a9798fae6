"""`encoder.revision`: a hub model's pinned revision reaches every read of its files (located,
its tokenizer, weights and sentence-transformers config), and makes other vectors. The hub is a
local hub cache holding the tiny model at one tag, read offline: nothing here reaches the hub."""

from __future__ import annotations

import pytest

from cpr_ray.config import load_config
from cpr_ray.errors import UserError
from cpr_ray.retrieval.encoder import DenseEncoder
from cpr_ray.retrieval.spec import EncoderSpec, vector_identity

pytestmark = pytest.mark.usefixtures("one_torch_thread")

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def pinned_hub(tmp_path, tiny_bert, monkeypatch) -> str:
    """A hub cache holding org/tiny at tag v1 only (no main), read offline."""
    from cpr_ray.retrieval.encoder import Encoder

    repo = tmp_path / "hub" / "models--org--tiny"
    Encoder.build(tiny_bert).save_sentence_transformers(repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "v1").write_text(COMMIT)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    return "org/tiny"


def test_a_pinned_revision_is_what_loads(pinned_hub):
    cfg = load_config(env={}, overrides=[f"encoder.model={pinned_hub}", "encoder.revision=v1"])
    spec = EncoderSpec.from_config(cfg.encoder)
    assert spec.revision == "v1" and spec.loading["revision"] == "v1"
    vectors = DenseEncoder(spec).encode_docs(["a problem", "an idea"])
    assert vectors.shape == (2, 32)
    # unpinned, the hub's main: not in this cache, so not loaded in its place
    with pytest.raises(UserError, match=r"org/tiny.* not in the local hub cache"):
        DenseEncoder(EncoderSpec(model=pinned_hub))


def test_a_pin_is_part_of_the_vector_identity_only_when_set(tiny_bert):
    plain, pinned = EncoderSpec(model="org/tiny"), EncoderSpec(model="org/tiny", revision="v1")
    assert vector_identity(pinned) == {**vector_identity(plain), "revision": "v1"}
    assert "revision" not in vector_identity(plain)  # stores made before the setting stay valid
    # a model folder ignores it (transformers reads the folder)
    folder = DenseEncoder(EncoderSpec(model=tiny_bert, device="cpu", revision="v1"))
    assert folder.encode_docs(["x"]).shape == (1, 32)
