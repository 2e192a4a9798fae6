"""Low-rank adapters (``train.lora``, peft's LoRA) on the encoder's backbone.

`add_adapters` wraps ``Encoder.backbone`` in a peft model in place: every targeted linear layer
gains two small matrices (A: r × in, B: out × r; the layer computes W·x + (alpha / r)·B·A·x),
and only they require gradients, so the optimiser, DDP's all-reduce and FSDP's reduce-scatter
see the adapters alone. The encoder's forward still calls its backbone, which peft passes
through. ``all-linear`` on a bare backbone (an ``AutoModel``, no LM head) is every linear
layer; BERT's pooler is never targeted: the pooled embedding does not use it, so its adapters
would get no gradient (what `freeze_unused` prevents for the pooler's own weights), and the
memory plan (`memory_plan._targets`) counts without it too.

A training checkpoint holds the adapters alone (`save_adapter`: peft's own
``adapter_model.safetensors`` and ``adapter_config.json``, so ``PeftModel.from_pretrained`` over
the base model reads it as well). The final model is merged (`merge`): W + (alpha / r)·B·A
written into the base weights, a plain transformers model that sentence-transformers loads
without peft.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from cpr_ray.config import LoRAConfig
from cpr_ray.errors import ConfigError
from cpr_ray.retrieval.encoder import Encoder

ADAPTER_WEIGHTS = "adapter_model.safetensors"  # peft's file names
ADAPTER_CONFIG = "adapter_config.json"
NOT_TARGETED = r"(.*\.)?pooler(\..*)?"  # module names peft leaves alone (a full match)


def peft_config(lora: LoRAConfig) -> Any:
    """peft's LoraConfig for `lora`; a str target is a regular expression over the whole
    module name, a tuple names modules or name suffixes, as peft reads them."""
    from peft import LoraConfig

    targets = lora.target_modules
    return LoraConfig(
        r=lora.r,
        # peft types it int but only divides by it (scale = alpha / r): a float is meant
        lora_alpha=lora.alpha,  # type: ignore[arg-type]
        lora_dropout=lora.dropout,
        target_modules=targets if isinstance(targets, str) else list(targets),
        exclude_modules=NOT_TARGETED,
    )


def add_adapters(encoder: Encoder, lora: LoRAConfig, seed: int) -> None:
    """Wrap `encoder`'s backbone with fresh adapters, in place; only they stay trainable.

    B starts at zero (the adapted model is the base one), A at random from `seed`, drawn
    without touching the global random state: every worker draws the same A, which FSDP
    needs (it shards each worker's own copy and never broadcasts one). The encoder keeps its
    train or eval mode."""
    from peft import get_peft_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            encoder.backbone = get_peft_model(encoder.backbone, peft_config(lora))
        except ValueError as exc:  # peft's "Target modules … not found in the base model"
            raise ConfigError(f"train.lora.target_modules {lora.target_modules!r}: {exc}") from None
    encoder.train(encoder.training)  # peft's new dropout modules start in train mode


def adapter_state_dict(encoder: Encoder) -> dict[str, torch.Tensor]:
    """The adapters' weights alone, named as peft saves them (no base weight)."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(encoder.backbone)


def load_adapter_state(encoder: Encoder, state: dict[str, torch.Tensor]) -> None:
    """Adapter weights `adapter_state_dict` gave into an encoder `add_adapters` wrapped with
    the same settings; a missing or unknown adapter weight raises."""
    from peft import set_peft_model_state_dict

    # torch's _IncompatibleKeys, which peft's annotation leaves as a namedtuple mypy cannot read
    result: Any = set_peft_model_state_dict(encoder.backbone, state)
    missing = [k for k in result.missing_keys if ".lora_" in k]  # the base weights are not
    if missing or result.unexpected_keys:
        raise RuntimeError(
            f"adapter state does not fit the model: missing {missing[:3]}, "
            f"unexpected {list(result.unexpected_keys)[:3]}"
        )


def save_adapter(encoder: Encoder, folder: str) -> None:
    """The adapters and their settings into `folder`, in peft's format."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in adapter_state_dict(encoder).items()}
    save_file(state, os.path.join(folder, ADAPTER_WEIGHTS), metadata={"format": "pt"})
    encoder.backbone.peft_config["default"].save_pretrained(folder)


def load_adapter(encoder: Encoder, folder: str) -> None:
    """The adapters `save_adapter` wrote into an encoder wrapped with the same settings."""
    from safetensors.torch import load_file

    load_adapter_state(encoder, load_file(os.path.join(folder, ADAPTER_WEIGHTS)))


def load_trainable_state(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """`module`'s trainable parameters (the adapters) from `state`, named as
    ``module.state_dict()`` names them; the frozen base weights stay as they are."""
    result = module.load_state_dict(state, strict=False)
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    missing = [k for k in result.missing_keys if k in trainable]
    if missing or result.unexpected_keys:
        raise RuntimeError(
            f"trainable state does not fit the model: missing {missing[:3]}, "
            f"unexpected {list(result.unexpected_keys)[:3]}"
        )


@torch.no_grad()
def merge(encoder: Encoder) -> Encoder:
    """A plain encoder over the base model with the adapters merged into its weights.

    It takes the adapted encoder's modules: that encoder is not to be used afterwards."""
    backbone = encoder.backbone.merge_and_unload()
    merged = Encoder(
        backbone,
        encoder.tokenizer,
        encoder.pooling,
        normalize=encoder.normalize,
        max_length=encoder.max_length,
        prompts=encoder.prompts,
    )
    return merged.train(encoder.training)
