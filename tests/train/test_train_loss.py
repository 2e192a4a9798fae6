"""The InfoNCE loss against a plain per-query computation on fixed tensors."""

from __future__ import annotations

import math

import pytest
import torch

from cpr_ray.train.loss import InfoNCELoss, gather, gather_with_grad

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TAU = 0.05


def _unit(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(*shape, generator=g), dim=-1)


def reference(q, p, n, valid, pos_keys, neg_keys, weights=None) -> float:
    """Per query: -log softmax of its positive among the candidates a reader would list by
    hand: every positive and every real hard negative of the batch, less any other copy of the
    query's own positive document."""
    b, k = valid.shape
    docs = [(p[j], int(pos_keys[j]), ("pos", j)) for j in range(b)]
    docs += [
        (n[j, s], int(neg_keys[j, s]), ("neg", j, s))
        for j in range(b)
        for s in range(k)
        if valid[j, s]
    ]
    losses = []
    for i in range(b):
        cands = [
            float(q[i] @ vec) / TAU
            for vec, key, tag in docs
            if key != int(pos_keys[i]) or tag == ("pos", i)
        ]
        own = float(q[i] @ p[i]) / TAU
        losses.append(-own + math.log(sum(math.exp(c) for c in cands)))
    w = [1.0] * b if weights is None else weights
    return sum(li * wi for li, wi in zip(losses, w)) / b


def _case(b: int = 4, k: int = 3, d: int = 8):
    q, p, n = _unit(b, d, seed=1), _unit(b, d, seed=2), _unit(b, k, d, seed=3)
    valid = torch.ones(b, k, dtype=torch.bool)
    valid[1, 2] = False  # query 1 has two hard negatives, query 3 none
    valid[3] = False
    pos_keys = torch.arange(100, 100 + b)
    neg_keys = torch.arange(b * k).reshape(b, k)
    return q, p, n, valid, pos_keys, neg_keys


def test_loss_with_hard_negatives_equals_reference():
    q, p, n, valid, pk, nk = _case()
    out = InfoNCELoss(TAU)(q, p, n, valid, pk, nk)
    assert out.loss.item() == pytest.approx(reference(q, p, n, valid, pk, nk), rel=1e-5)
    q_best = torch.nn.functional.normalize(p + 0.01 * q, dim=-1)  # each nearest its positive
    assert InfoNCELoss(TAU)(q_best, p, n, valid, pk, nk).accuracy.item() == 1.0


def test_loss_in_batch_only_equals_reference():
    q, p, _, _, pk, _ = _case()
    empty = torch.zeros(4, 0, 8)
    none = torch.zeros(4, 0, dtype=torch.bool)
    keys = torch.zeros(4, 0, dtype=torch.long)
    out = InfoNCELoss(TAU)(q, p, empty, none, pk, keys)
    assert out.loss.item() == pytest.approx(reference(q, p, empty, none, pk, keys), rel=1e-5)
    expected = torch.nn.functional.cross_entropy(q @ p.T / TAU, torch.arange(4))
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_content_word_weights_have_mean_one():
    q, p, n, valid, pk, nk = _case()
    cw = torch.tensor([2, 6, 0, 4])  # a query of stop words alone counts as 1
    out = InfoNCELoss(TAU)(q, p, n, valid, pk, nk, cw)
    counts = [2, 6, 1, 4]
    weights = [c / (sum(counts) / 4) for c in counts]
    assert out.loss.item() == pytest.approx(reference(q, p, n, valid, pk, nk, weights), rel=1e-5)


def test_sibling_queries_are_not_each_others_negatives():
    q, p, n, valid, pk, nk = _case()
    pk = torch.tensor([100, 100, 102, 103])  # queries 0 and 1 share a positive paper
    nk[2, 0] = 103  # query 2's hard negative is query 3's positive
    out = InfoNCELoss(TAU)(q, p, n, valid, pk, nk)
    assert out.loss.item() == pytest.approx(reference(q, p, n, valid, pk, nk), rel=1e-5)
    unmasked = InfoNCELoss(TAU)(q, p, n, valid, torch.arange(100, 104), nk)
    assert out.loss.item() != pytest.approx(unmasked.loss.item(), rel=1e-3)


def test_gradients_match_reference_autograd():
    q, p, n, valid, pk, nk = _case()
    q, p = q.clone().requires_grad_(), p.clone().requires_grad_()
    InfoNCELoss(TAU)(q, p, n, valid, pk, nk).loss.backward()
    q2, p2 = q.detach().clone().requires_grad_(), p.detach().clone().requires_grad_()
    docs = torch.cat([p2, n.reshape(-1, 8)[valid.reshape(-1)]])
    keys = torch.cat([pk, nk.reshape(-1)[valid.reshape(-1)]])
    scores = q2 @ docs.T / TAU
    mask = (keys[None] != pk[:, None]) | (torch.arange(len(keys))[None] == torch.arange(4)[:, None])
    loss = torch.nn.functional.cross_entropy(scores.masked_fill(~mask, -torch.inf), torch.arange(4))
    loss.backward()
    torch.testing.assert_close(q.grad, q2.grad)
    torch.testing.assert_close(p.grad, p2.grad)


def test_gathers_are_the_identity_in_one_process():
    t = torch.randn(3, 2, requires_grad=True)
    assert gather_with_grad(t) is t
    assert gather(t) is t
    with pytest.raises(ValueError, match="temperature"):
        InfoNCELoss(0.0)
