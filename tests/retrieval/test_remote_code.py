"""`encoder.trust_remote_code`: a model whose architecture is its own Python code (as
nvidia/llama-embed-nemotron-8b's is) loads only with the setting, on every path that loads an
encoder, and fails without it in one line naming the setting. The model is the tiny local
`remote_code_model` (tests/tiny_models.py), so nothing here reaches the hub."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cpr_ray.config import load_config
from cpr_ray.errors import ConfigError, UserError
from cpr_ray.retrieval.encoder import DenseEncoder, Encoder
from cpr_ray.retrieval.model_source import model_config
from cpr_ray.retrieval.spec import EncoderSpec, RetrieverOptions, vector_identity
from cpr_ray.train.memory_plan import architecture, model_name

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SETTING = "encoder.trust_remote_code"


def _one_line_naming_the_setting(exc: pytest.ExceptionInfo) -> None:
    message = str(exc.value)
    assert SETTING in message and "\n" not in message, message


def test_encoder_loads_the_models_own_code_only_when_allowed(remote_code_model, tmp_path):
    with pytest.raises(UserError) as refused:
        Encoder.load(remote_code_model)
    _one_line_naming_the_setting(refused)

    enc = Encoder.load(remote_code_model, trust_remote_code=True)
    assert type(enc.backbone).__name__ == "CprXModel"  # the folder's class, not BertModel
    assert enc.pooling == "mean" and enc.dim == 32
    vec = enc(enc.tokenize(["a problem", "an idea"]))
    assert vec.shape == (2, 32) and torch.allclose(vec.norm(dim=-1), torch.ones(2))
    assert Encoder.build(remote_code_model, trust_remote_code=True).training

    # what training saves (OUT/model) keeps the code, and needs the setting to load again
    enc.save_sentence_transformers(tmp_path / "model")
    assert (tmp_path / "model" / "modeling_cprx.py").is_file()
    with pytest.raises(UserError) as again:
        Encoder.load(str(tmp_path / "model"))
    _one_line_naming_the_setting(again)
    reloaded = Encoder.load(str(tmp_path / "model"), trust_remote_code=True)
    assert type(reloaded.backbone).__name__ == "CprXModel"


def test_a_dense_encoder_from_the_config_encodes_with_the_setting(remote_code_model):
    docs = ["graph neural networks for molecules", "a protein folding benchmark"]
    on = load_config(
        "dry-run", env={}, overrides=[f"encoder.model={remote_code_model}", f"{SETTING}=true"]
    )
    assert on.encoder.trust_remote_code
    spec = RetrieverOptions.from_config(on).encoder_spec(remote_code_model)
    assert spec.trust_remote_code  # the spec is what travels to Ray's encoder actors
    vectors = DenseEncoder(spec).encode_docs(docs)
    assert vectors.shape == (2, 32) and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)

    off = load_config("dry-run", env={}, overrides=[f"encoder.model={remote_code_model}"])
    assert not off.encoder.trust_remote_code  # the default
    with pytest.raises(UserError) as refused:
        DenseEncoder(RetrieverOptions.from_config(off).encoder_spec(remote_code_model))
    _one_line_naming_the_setting(refused)


def test_the_training_checks_name_the_setting(remote_code_model):
    with pytest.raises(ConfigError) as refused:
        # before run.json is written and the workers start, and by the memory plan
        model_config(EncoderSpec(model=remote_code_model))
    _one_line_naming_the_setting(refused)
    trusted = EncoderSpec(model=remote_code_model, trust_remote_code=True)
    config = model_config(trusted)
    arch = architecture(config, model_name(remote_code_model), trusted)
    loaded = Encoder.load(remote_code_model, trust_remote_code=True)
    assert arch.parameters == sum(p.numel() for p in loaded.parameters())


def test_the_setting_changes_no_vector_and_no_stage_fingerprint():
    """It says whether a model's code may run, not what the model computes: cached vectors and
    pooled candidates stay valid, and a build pooled before the setting existed is not pooled
    again (its fingerprint is what it was)."""
    spec = EncoderSpec(model="some/model")
    trusted = EncoderSpec(model="some/model", trust_remote_code=True)
    assert vector_identity(spec) == vector_identity(trusted)

    cfg = load_config("dry-run", env={})
    pooler = cfg.pooling.poolers[0]
    assert pooler.encoder is not None
    poolers = [
        pooler.model_copy(
            update={"encoder": pooler.encoder.model_copy(update={"trust_remote_code": True})}
        ),
        *cfg.pooling.poolers[1:],
    ]
    changed = cfg.model_copy(
        update={"pooling": cfg.pooling.model_copy(update={"poolers": poolers})}
    )
    assert changed.section_hash("pooling") == cfg.section_hash("pooling")
    # the fingerprint is the settings as they were before the setting existed
    before = cfg.pooling.model_dump(mode="json")
    for p in before["poolers"]:
        if p["encoder"] is not None:
            del p["encoder"]["trust_remote_code"]
    assert cfg.pooling.fingerprint() == before
    # settings that change the vectors still change it
    other = pooler.encoder.model_copy(update={"max_length": 64})
    moved = cfg.pooling.model_copy(
        update={"poolers": [pooler.model_copy(update={"encoder": other})]}
    )
    assert moved.fingerprint() != cfg.pooling.model_copy(update={"poolers": [pooler]}).fingerprint()
