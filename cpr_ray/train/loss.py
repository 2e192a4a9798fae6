"""InfoNCE over the global batch (§4.1): each query against its positive, its own hard
negatives and every other document of the batch, on every worker.

Each worker scores its own queries against the documents of all workers. The documents are
gathered with their gradients: the gather's backward sends each worker the gradient of every
worker's loss with respect to its own documents (a plain ``all_gather`` returns tensors cut from
the graph, and training then silently follows the wrong gradient). With DDP averaging the
parameter gradients, every worker steps on the gradient of the loss of the whole batch, as one
process would. Not distributed, the gather is the identity, so one code path serves a unit test
and many GPUs.

Masking by document key: a column whose document is the query's own positive but is not the
query's positive column (the same paper as another query's positive, or as someone's hard
negative) is no negative of it, so sibling queries of one positive (multi-query data) are never
each other's negatives. Padding columns (queries with fewer hard negatives) are masked too.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def gather_with_grad(t: torch.Tensor) -> torch.Tensor:
    """(W·n, …): every worker's `t` in rank order, gradients flowing back to each worker's own
    part; `t` itself when not distributed. Ranks must pass equal shapes."""
    if not _distributed():
        return t
    with warnings.catch_warnings():  # torch marks it deprecated for _functional_collectives,
        warnings.simplefilter("ignore")  # which offers no autograd-aware all_gather on gloo
        import torch.distributed.nn.functional as dist_fn

        return torch.cat(dist_fn.all_gather(t), dim=0)


def gather(t: torch.Tensor) -> torch.Tensor:
    """(W·n, …) without gradients (ids, masks, weights); `t` when not distributed."""
    if not _distributed():
        return t
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts, dim=0)


def rank() -> int:
    return dist.get_rank() if _distributed() else 0


@dataclass(frozen=True)
class LossOutput:
    loss: torch.Tensor  # () this worker's share of the batch loss (the mean over workers is it)
    accuracy: torch.Tensor  # () share of this worker's queries whose positive scores highest


def info_nce(
    q: torch.Tensor,
    docs: torch.Tensor,
    labels: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor,
    temperature: float,
) -> LossOutput:
    """Weighted InfoNCE of local queries over candidate documents: pure tensor maths.

    q (b, d) and docs (m, d) normalised embeddings; labels (b,) each query's positive column;
    mask (b, m) True where a column is a candidate of the query (its positive always is);
    weights (b,) per-query loss weights.
    """
    scores = q @ docs.T / temperature  # (b, m) cosine similarity / τ
    scores = scores.masked_fill(~mask, float("-inf"))  # (b, m)
    per_query = nn.functional.cross_entropy(scores, labels, reduction="none")  # (b,)
    loss = (per_query * weights).mean()  # ()
    accuracy = (scores.argmax(dim=1) == labels).float().mean()  # ()
    return LossOutput(loss, accuracy)


class InfoNCELoss(nn.Module):
    """Embeddings of this worker's part of the batch -> its share of the global-batch loss."""

    def __init__(self, temperature: float = 0.05) -> None:
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.temperature = temperature

    def forward(
        self,
        q: torch.Tensor,
        positives: torch.Tensor,
        negatives: torch.Tensor,
        negative_valid: torch.Tensor,
        positive_keys: torch.Tensor,
        negative_keys: torch.Tensor,
        cw: torch.Tensor | None = None,
    ) -> LossOutput:
        """q, positives (b, d); negatives (b, k, d) padded, negative_valid (b, k) marks the
        real ones; positive_keys (b,), negative_keys (b, k) document keys; cw (b,) content-word
        counts to weight queries by (normalised to mean 1 over the global batch), or None.
        Every worker passes the same b and k."""
        b, k, d = negatives.shape
        docs = gather_with_grad(positives)  # (W·b, d) column j: positive of global query j
        keys = gather(positive_keys)  # (W·b,)
        valid = torch.ones_like(keys, dtype=torch.bool)  # (W·b,)
        if k:
            n_all = gather_with_grad(negatives.reshape(b * k, d))  # (W·b·k, d)
            docs = torch.cat([docs, n_all])  # (m, d), m = W·b·(1 + k)
            keys = torch.cat([keys, gather(negative_keys.reshape(-1))])  # (m,)
            flat_valid = negative_valid.reshape(-1).to(torch.uint8)  # NCCL gathers no bool
            valid = torch.cat([valid, gather(flat_valid).bool()])  # (m,)
        labels = torch.arange(b, device=q.device) + rank() * b  # (b,) own positive's column
        own = torch.zeros(b, docs.shape[0], dtype=torch.bool, device=q.device)  # (b, m)
        own[torch.arange(b, device=q.device), labels] = True
        same_doc = keys.unsqueeze(0) == positive_keys.unsqueeze(1)  # (b, m) the positive again
        mask = valid.unsqueeze(0) & (~same_doc | own)  # (b, m)
        if cw is None:
            weights = torch.ones(b, device=q.device)  # (b,)
        else:
            counts = cw.float().clamp(min=1)  # (b,) a query of stop words alone still counts 1
            weights = counts / gather(counts).mean()  # (b,) mean 1 over the global batch
        return info_nce(q, docs, labels, mask, weights, self.temperature)
