"""Tiny randomly initialised models, built from a transformers config, for tests.

No model hub here: a test that needs BERT's code paths (an encoder, SPLADE's masked-LM head, a
cross-encoder's classification head) or Qwen3's (a decoder with grouped-query attention, pooled
at its last token) builds one of a few MB with MiniLM's tokenizer, seeded, so every run and every
test that asks for the same shape gets the same weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

BertHead = Literal["encoder", "masked_lm", "classifier"]


def tiny_bert(
    tokenizer_from: str,
    folder: Path,
    *,
    head: BertHead = "encoder",
    layers: int = 2,
    intermediate: int = 64,
    max_positions: int = 64,
    dropout: float = 0.1,
) -> str:
    """A 32-wide random BERT (two heads) saved with `tokenizer_from`'s tokenizer; returns the
    folder. `classifier` has one label, a cross-encoder's relevance score."""
    import torch
    from transformers import (
        AutoTokenizer,
        BertConfig,
        BertForMaskedLM,
        BertForSequenceClassification,
        BertModel,
    )

    tok = AutoTokenizer.from_pretrained(tokenizer_from)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=intermediate,
        max_position_embeddings=max_positions,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        num_labels=1,
    )
    model = {
        "encoder": BertModel,
        "masked_lm": BertForMaskedLM,
        "classifier": BertForSequenceClassification,
    }[head](config)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def tiny_qwen3(
    tokenizer_from: str,
    folder: Path,
    *,
    hidden: int = 128,
    intermediate: int = 384,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 48,
    max_positions: int = 512,
) -> str:
    """A random Qwen3 decoder (GQA: `heads` query heads over `kv_heads` key/value heads, q/k
    norms) saved with `tokenizer_from`'s tokenizer; returns the folder."""
    import torch
    from transformers import AutoTokenizer, Qwen3Model

    tok = AutoTokenizer.from_pretrained(tokenizer_from)
    torch.manual_seed(0)
    config = qwen3_config(len(tok), hidden, intermediate, layers, heads, kv_heads, head_dim)
    config.max_position_embeddings = max_positions
    config.pad_token_id = tok.pad_token_id
    Qwen3Model(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def qwen3_config(
    vocab: int,
    hidden: int,
    intermediate: int,
    layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    **extra: object,
) -> Any:
    """A Qwen3Config by the seven numbers that give a Qwen3 its shape (the rest: `extra`), so a
    test names a shape in one line instead of transformers' long keyword names."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        **extra,
    )


# an architecture transformers does not know, shipped as the model folder's own code
REMOTE_CODE_FILES = {
    "configuration_cprx.py": """from transformers import BertConfig


class CprXConfig(BertConfig):
    model_type = "cpr-test-bert"
""",
    "modeling_cprx.py": """from transformers import BertModel

from .configuration_cprx import CprXConfig


class CprXModel(BertModel):
    config_class = CprXConfig
""",
}


def remote_code_bert(tokenizer_from: str, folder: Path) -> str:
    """A tiny random BERT whose architecture is the folder's own code (`auto_map`, a model type
    transformers does not know), as nvidia/llama-embed-nemotron-8b's is: transformers loads it
    only with trust_remote_code."""
    tiny_bert(tokenizer_from, folder)
    for name, code in REMOTE_CODE_FILES.items():
        (folder / name).write_text(code)
    config = json.loads((folder / "config.json").read_text())
    config.update(
        model_type="cpr-test-bert",
        architectures=["CprXModel"],
        auto_map={
            "AutoConfig": "configuration_cprx.CprXConfig",
            "AutoModel": "modeling_cprx.CprXModel",
        },
    )
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return str(folder)
