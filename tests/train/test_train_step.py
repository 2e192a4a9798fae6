"""One training step with MiniLM in one process: the loss goes down, the gradient cache gives
the plain step's gradients, the saved model is what sentence-transformers loads, and LoRA
trains only its adapters and merges into a plain model that encodes as the adapted one."""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pytest
import torch

from cpr_ray.config import LoRAConfig
from cpr_ray.errors import ConfigError
from cpr_ray.queries.content_words import content_word_counts
from cpr_ray.retrieval.encoder import DenseEncoder, Encoder
from cpr_ray.retrieval.spec import EncoderSpec
from cpr_ray.train.examples import EXAMPLES
from cpr_ray.train.formats.common import text_keys
from cpr_ray.train.lora import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    adapter_state_dict,
    add_adapters,
    load_adapter,
    merge,
    save_adapter,
)
from cpr_ray.train.loss import InfoNCELoss
from cpr_ray.train.step import (
    ContrastiveStep,
    Examples,
    StepOptions,
    Towers,
    cosine_schedule,
    freeze_unused,
    global_batch_rows,
    optimizer_for,
)

WORDS = (
    "amber basalt cobalt dune ember fjord garnet harbor indigo jasper kelp lagoon marble".split()
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

_rng = np.random.default_rng(0)
# arbitrary pairings: nothing the pretrained model already knows, so its loss starts high
TOPICS = [(" ".join(_rng.choice(WORDS, 3)), " ".join(_rng.choice(WORDS, 4))) for _ in range(8)]


def examples(counts: Sequence[int] = (1,) * len(TOPICS)) -> Examples:
    """The TOPICS pairs, query i with counts[i] hard negatives (the positives of queries i+3,
    i+5, …)."""
    n = len(TOPICS)
    queries = [q for q, _ in TOPICS]
    positives = [d for _, d in TOPICS]
    negatives = [[positives[(i + 3 + 2 * j) % n] for j in range(counts[i])] for i in range(n)]
    return examples_of(queries, positives, negatives)


def examples_of(queries: list[str], positives: list[str], negatives: list[list[str]]) -> Examples:
    """Training examples of these texts, keyed and counted as the data stage writes them."""
    table = pa.table(
        {
            "query_id": [str(i) for i in range(len(queries))],
            "query": queries,
            "positive": positives,
            "negatives": negatives,
            "positive_key": text_keys(pa.array(positives)),
            "negative_keys": [text_keys(pa.array(n)).to_pylist() for n in negatives],
            "cw": pa.array(content_word_counts(queries), pa.int32()),
            "field": [None] * len(queries),
            "domain": [None] * len(queries),
        },
        schema=EXAMPLES,
    )
    return Examples(table, max(map(len, negatives)))


def _step(encoder: Encoder, optimizer, chunk: int | None, cw: bool = False) -> ContrastiveStep:
    freeze_unused(encoder)
    return ContrastiveStep(
        Towers(encoder),
        encoder,
        InfoNCELoss(0.05),
        optimizer,
        cosine_schedule(optimizer, 100),
        StepOptions(chunk_size=chunk, max_grad_norm=None, cw_weighting=cw),
    )


def _batch_loss(encoder: Encoder, ex: Examples) -> float:
    step = _step(encoder, torch.optim.SGD(encoder.parameters(), lr=0.0), None)
    with torch.no_grad():
        b = ex.batch(np.arange(len(ex)))
        q, d = [encoder(encoder.tokenize(t)) for t in step._texts(b)]
        return step.loss_of(q, d, b).loss.item()


def test_short_minilm_run_lowers_the_loss(minilm_encoder: Encoder):
    enc = minilm_encoder
    enc.max_length = 32
    ex = examples()
    before = _batch_loss(enc, ex)
    opt = optimizer_for(enc, lr=2e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    step = _step(enc, opt, chunk=None)
    losses = [step(ex.batch(global_batch_rows(len(ex), 4, 42, s)))["loss"] for s in range(4)]
    assert all(np.isfinite(losses))
    assert _batch_loss(enc, ex) < before - 1.0  # about 7 -> 2 here


def test_gradient_cache_gives_the_plain_step(tiny_bert: str):
    plain = Encoder.build(tiny_bert).eval()  # no dropout: both ways see the same network
    cached = copy.deepcopy(plain)
    for enc in (plain, cached):
        enc.max_length = 32
    batch = examples().batch(np.arange(6))  # 6 queries + 12 documents: chunks of 4 texts
    m_plain = _step(plain, torch.optim.SGD(plain.parameters(), lr=1.0), None, cw=True)(batch)
    m_cached = _step(cached, torch.optim.SGD(cached.parameters(), lr=1.0), 4, cw=True)(batch)
    assert m_cached["gradient_cache"] and not m_plain["gradient_cache"]
    assert m_cached["loss"] == pytest.approx(m_plain["loss"], rel=1e-5)
    assert m_cached["grad_norm"] == pytest.approx(m_plain["grad_norm"], rel=1e-4)
    with torch.no_grad():  # SGD at lr 1: equal parameters after the step, equal gradients
        worst = max(
            (a - b).abs().max().item() for a, b in zip(plain.parameters(), cached.parameters())
        )
    assert worst < 2e-6


def test_batches_are_fixed_by_seed_and_step():
    rows = [global_batch_rows(10, 4, 42, s) for s in range(6)]  # 3 steps per epoch
    epoch = np.concatenate(rows[:3])
    assert sorted(set(epoch[:10].tolist())) == list(range(10))
    assert len(set(rows[2].tolist())) == 4  # the short last batch wraps, no repeats
    assert all(
        np.array_equal(a, b)
        for a, b in zip(rows, [global_batch_rows(10, 4, 42, s) for s in range(6)])
    )
    assert not np.array_equal(rows[0], rows[3])  # a new permutation each epoch


def test_cosine_schedule_without_warmup():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=6e-6)
    sched = cosine_schedule(opt, 4)
    lrs = []
    for _ in range(4):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(6e-6) and lrs[2] == pytest.approx(3e-6)
    assert lrs == sorted(lrs, reverse=True) and lrs[-1] > 0


@pytest.mark.parametrize("model, pooling", [("minilm", "mean"), ("tiny_bert", "last_token")])
def test_saved_model_loads_in_sentence_transformers(request, tmp_path, model: str, pooling: str):
    from sentence_transformers import SentenceTransformer

    enc = Encoder.load(request.getfixturevalue(model), pooling, max_length=64)
    path = tmp_path / "model"
    enc.save_sentence_transformers(path, query_prefix="query: ", doc_prefix="")
    texts = ["how do ships reduce hull drag", "Wing shape gives birds lift."]
    st = SentenceTransformer(str(path), device="cpu")
    assert st.max_seq_length == 64
    ours = enc(enc.tokenize(["query: " + t for t in texts])).numpy()
    np.testing.assert_allclose(st.encode_query(texts), ours, atol=1e-5)
    np.testing.assert_allclose(
        st.encode_document(texts), enc(enc.tokenize(texts)).numpy(), atol=1e-5
    )
    served = DenseEncoder(EncoderSpec(model=str(path)))  # what `cpr eval --model PATH` builds
    assert (served.spec.pooling, served.spec.query_prefix, served.spec.doc_prefix) == (
        pooling,
        "query: ",
        "",
    )
    np.testing.assert_allclose(served.encode_queries(texts), ours, atol=1e-5)
    modules = json.loads((path / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == [
        "Transformer",
        "Pooling",
        "Normalize",
    ]


def test_lora_trains_only_adapters_and_merges_into_a_plain_model(tiny_bert: str, tmp_path):
    from safetensors import safe_open
    from sentence_transformers import SentenceTransformer

    texts = ["amber basalt cobalt", "dune ember fjord garnet harbor"]
    initial = Encoder.load(tiny_bert, "mean", max_length=32)
    with torch.no_grad():
        before = initial(initial.tokenize(texts))
    enc = Encoder.build(tiny_bert, "mean", max_length=32)
    freeze_unused(enc)
    lora = LoRAConfig(r=4, alpha=8.0, dropout=0.1)
    add_adapters(enc, lora, seed=0)
    # non-reentrant checkpointing needs no input that requires grad (peft's hook for it is off)
    enc.backbone.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs={"use_reentrant": False}
    )
    trainable = [n for n, p in enc.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n and ".pooler." not in n for n in trainable)
    start = {k: v.clone() for k, v in adapter_state_dict(enc).items()}
    opt = optimizer_for(enc, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    step = _step(enc, opt, chunk=4)  # the gradient cache: dropout on the adapters replayed
    ex = examples()
    for s in range(3):
        assert np.isfinite(step(ex.batch(global_batch_rows(len(ex), 4, 42, s)))["loss"])

    base = enc.backbone.get_base_model().state_dict()  # the injected model, adapters inside
    frozen = {k.replace(".base_layer.", "."): v for k, v in base.items() if ".lora_" not in k}
    untouched = initial.backbone.state_dict()
    assert frozen.keys() == untouched.keys()
    for name, tensor in untouched.items():  # weight decay included: not one bit moved
        assert torch.equal(frozen[name], tensor), name
    trained = adapter_state_dict(enc)
    assert all(not torch.equal(trained[k], v) for k, v in start.items())  # A and B

    enc.eval()
    with torch.no_grad():
        adapted = enc(enc.tokenize(texts))
    assert (adapted - before).abs().max() > 1e-3

    # a checkpoint's adapters alone, into fresh adapters (another seed) on the base model
    save_adapter(enc, str(tmp_path / "adapter"))
    assert {p.name for p in (tmp_path / "adapter").iterdir()} == {ADAPTER_WEIGHTS, ADAPTER_CONFIG}
    restored = Encoder.build(tiny_bert, "mean", max_length=32).eval()
    add_adapters(restored, lora, seed=1)
    load_adapter(restored, str(tmp_path / "adapter"))
    with torch.no_grad():
        torch.testing.assert_close(restored(restored.tokenize(texts)), adapted, rtol=0, atol=0)
    with pytest.raises(ValueError, match="merge them first"):
        restored.save_sentence_transformers(tmp_path / "unmerged")

    merged = merge(enc)
    assert not hasattr(merged.backbone, "peft_config")
    with torch.no_grad():
        torch.testing.assert_close(merged(merged.tokenize(texts)), adapted, rtol=0, atol=1e-5)
    path = tmp_path / "model"
    merged.save_sentence_transformers(path)
    assert not (path / ADAPTER_CONFIG).exists()
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert keys == set(untouched)  # the base model's names: no lora_, base_layer, base_model
    st = SentenceTransformer(str(path), device="cpu")
    np.testing.assert_allclose(st.encode(texts), adapted.numpy(), atol=1e-5)


def test_lora_targets_that_match_nothing_name_the_setting(tiny_bert: str):
    enc = Encoder.build(tiny_bert, "mean")
    with pytest.raises(ConfigError, match="train.lora.target_modules"):
        add_adapters(enc, LoRAConfig(target_modules=("no_such_layer",)), seed=0)
