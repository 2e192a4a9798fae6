"""Pooling of token states into one vector per text: pure tensor functions.

(Token pooling, not the candidate-pooling stage of ``cpr_ray.pooling``.)

`mean` (sentence-transformers MiniLM, E5), `cls` (BGE, SPECTER2, SciNCL), `last_token` (Qwen3-
Embedding and other decoder embedders; works with left or right padding) and `splade` (max over
tokens of log(1 + relu(MLM logits)), a vocabulary-sized sparse vector).
"""

from __future__ import annotations

import torch

from cpr_ray.retrieval.spec import POOLINGS


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).to(hidden.dtype)  # (b, L, 1)
    summed = (hidden * m).sum(dim=1)  # (b, d)
    return summed / m.sum(dim=1).clamp(min=1e-9)  # (b, d)


def cls_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return hidden[:, 0]  # (b, d)


def last_token_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The state of each text's last real token, whichever side the batch was padded on."""
    if bool(mask[:, -1].all()):  # left padding (or none): the last position is real everywhere
        return hidden[:, -1]  # (b, d)
    last = mask.long().sum(dim=1) - 1  # (b,) right padding: index of the last real token
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]  # (b, d)


def pool(mode: str, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if mode == "mean":
        return mean_pool(hidden, mask)
    if mode == "cls":
        return cls_pool(hidden, mask)
    if mode == "last_token":
        return last_token_pool(hidden, mask)
    raise ValueError(f"unknown pooling {mode!r}; known: {', '.join(POOLINGS)}")


def splade_pool(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """max over real tokens of log(1 + relu(logit)), per vocabulary entry.

    log1p and relu are monotonic, so the max is taken first: one pass over the (b, L, V) logits
    (which dominate SPLADE's cost on a CPU) and the transform on (b, V) only. Without gradients
    the padding is masked in place, sparing a (b, L, V) copy; `logits` is then overwritten.
    """
    pad = ~mask.bool().unsqueeze(-1)  # (b, L, 1)
    fill = logits.masked_fill if logits.requires_grad else logits.masked_fill_
    return torch.log1p(torch.relu(fill(pad, float("-inf")).amax(dim=1)))  # (b, V)
