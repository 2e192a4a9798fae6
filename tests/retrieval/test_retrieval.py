"""Retrieval: BM25 against the Lucene formula, token pooling, the Encoder module (auto pooling,
build vs load), tiny Qwen3/SPLADE models built from a config, MiniLM from its PyPI package,
faiss vs NumPy, and the Ray actor pool vs in-process."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests import tiny_models as tiny

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from cpr_ray.errors import UserError  # noqa: E402
from cpr_ray.evaluate.benchmark import pad_pools  # noqa: E402
from cpr_ray.retrieval import (  # noqa: E402
    PAD,
    EncoderSpec,
    RetrieverOptions,
    make_retriever,
    top_k_rows,
)
from cpr_ray.retrieval.bm25 import BM25Retriever, CollectionStats  # noqa: E402
from cpr_ray.retrieval.encoder import (  # noqa: E402
    DenseEncoder,
    Encoder,
    SpladeEncoder,
    read_sentence_transformers_config,
)
from cpr_ray.retrieval.ranking import rank_pools  # noqa: E402
from cpr_ray.retrieval.token_pooling import (  # noqa: E402
    last_token_pool,
    mean_pool,
    pool,
    splade_pool,
)

# a Qwen3 a quarter of tiny_qwen3's default width, one layer: enough for GQA and last-token pooling
QWEN3 = {"hidden": 32, "intermediate": 64, "layers": 1, "heads": 2, "kv_heads": 1, "head_dim": 16}

DOCS = [
    "The cats are sitting on the mat.",
    "Dogs running through the park chase cats.",
    "Quantum entanglement of photon pairs.",
    "A photon detector for quantum optics experiments in the lab.",
    "Market prices and fiscal policy.",
]


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory, minilm) -> dict[str, str]:
    """Randomly initialised SPLADE (BERT MLM) and Qwen3 models with MiniLM's WordPiece tokenizer."""
    root = tmp_path_factory.mktemp("tiny")
    return {
        "splade": tiny.tiny_bert(
            minilm,
            root / "splade-tiny",
            head="masked_lm",
            layers=1,
            intermediate=37,
            max_positions=128,
        ),
        "qwen": tiny.tiny_qwen3(minilm, root / "Qwen3-Embedding-tiny", max_positions=128, **QWEN3),
    }


# -- BM25 --------------------------------------------------------------------------------------
def lucene_bm25(query: list[str], doc: list[str], docs: list[list[str]], k1=1.2, b=0.75) -> float:
    """Lucene's BM25 (since Lucene 8 without the constant (k1 + 1) factor in the numerator)."""
    n, avgdl = len(docs), sum(map(len, docs)) / len(docs)
    score = 0.0
    for term in set(query):
        df = sum(term in d for d in docs)
        if df == 0:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        tf = doc.count(term)
        score += idf * tf / (tf + k1 * (1 - b + b * len(doc) / avgdl))
    return score


def test_bm25_matches_the_lucene_formula_with_stemming_and_stop_words():
    import re

    import Stemmer
    from bm25s.stopwords import STOPWORDS_EN

    stem = Stemmer.Stemmer("english")

    def tokens(text: str) -> list[str]:
        words = re.findall(r"(?u)\b\w\w+\b", text.lower())
        return [stem.stemWord(w) for w in words if w not in STOPWORDS_EN]

    tokenised = [tokens(d) for d in DOCS]
    assert tokenised[0] == ["cat", "sit", "mat"]
    bm25 = make_retriever("bm25")
    bm25.index(DOCS)
    queries = ["cat sitting", "photons and quantum", "the"]
    scores = bm25.score(queries, pad_pools([list(range(5))] * 3))
    for qi, q in enumerate(queries):
        qt = tokens(q)
        expected = [lucene_bm25(qt, d, tokenised) for d in tokenised]
        np.testing.assert_allclose(scores[qi], expected, rtol=1e-5)
    assert scores[0][0] > 0 and scores[0][1] > 0  # "cats" matched "cat" through stemming
    assert (scores[2] == 0).all()  # a stop word alone matches nothing
    idx, val = bm25.search(queries[:2], 2)
    assert idx.tolist() == [[0, 1], [2, 3]] and (val[:, 0] >= val[:, 1]).all()
    # in parts (pooling's shards) with the collection's statistics, summed over other parts:
    # each part's scores are the whole's, bit for bit (the last bit decides ties when merged)
    rng = np.random.default_rng(0)
    docs = [" ".join(rng.choice(DOCS[i % 5].split(), i % 7)) for i in range(500)]  # "" too
    queries = [" ".join(rng.choice(" ".join(DOCS).split(), 4)) for _ in range(20)]
    bm25.index(docs)
    terms = bm25.terms(queries)
    stats = CollectionStats.total(bm25.statistics(docs[i::3], terms) for i in range(3))
    for s in range(4):
        part = BM25Retriever()
        part.index(docs[s::4], stats)
        assert np.array_equal(part.scores(queries), bm25.scores(queries)[:, s::4])


def test_bm25_takes_no_model_and_unknown_names_fail():
    with pytest.raises(ValueError, match="bm25 takes no --model"):
        make_retriever("bm25", "x")
    with pytest.raises(ValueError, match="unknown retriever 'colbert'"):
        make_retriever("colbert")


# -- ranking ------------------------------------------------------------------------------------
def test_ties_are_broken_by_a_seeded_key_not_by_pool_order():
    pools = np.tile(np.arange(151), (400, 1))
    ranked = rank_pools(np.zeros(pools.shape), pools, seed=0)
    first = np.array([r[0] for r in ranked])
    assert (first == 0).mean() < 0.05  # the first pool entry (CPR's positive) is not favoured
    again = rank_pools(np.zeros(pools.shape), pools, seed=0)
    assert all((a == b).all() for a, b in zip(ranked, again))
    # padding never ranks, scores order the rest
    out = rank_pools(np.array([[0.1, 0.9, 5.0]]), np.array([[4, 7, PAD]]))
    assert out[0].tolist() == [7, 4]


def test_top_k_rows():
    s = np.array([[0.1, 0.5, 0.5, 0.9], [3, 2, 1, 0]])
    idx, val = top_k_rows(s, 3)
    assert idx.tolist() == [[3, 1, 2], [0, 1, 2]] and val[0].tolist() == [0.9, 0.5, 0.5]


# -- pooling ------------------------------------------------------------------------------------
def test_pooling_functions():
    hidden = torch.arange(2 * 3 * 2, dtype=torch.float32).reshape(2, 3, 2)
    right = torch.tensor([[1, 1, 0], [1, 1, 1]])
    left = torch.tensor([[0, 1, 1], [1, 1, 1]])
    assert torch.equal(mean_pool(hidden, right)[0], hidden[0, :2].mean(0))
    assert torch.equal(last_token_pool(hidden, right)[0], hidden[0, 1])
    assert torch.equal(last_token_pool(hidden, left)[0], hidden[0, 2])
    assert torch.equal(pool("cls", hidden, right), hidden[:, 0])
    with pytest.raises(ValueError, match="unknown pooling 'max'"):
        pool("max", hidden, right)
    logits = torch.tensor([[[-1.0, 2.0], [3.0, -2.0], [9.0, 9.0]]])
    got = splade_pool(logits, torch.tensor([[1, 1, 0]]))  # the padded position is ignored
    assert torch.allclose(got, torch.log1p(torch.tensor([[3.0, 2.0]])))


def test_presets_by_model_name():
    qwen = EncoderSpec(model="Qwen/Qwen3-Embedding-0.6B").resolved()
    assert qwen.pooling == "last_token" and qwen.query_prefix.startswith("Instruct: ")
    assert qwen.doc_prefix == ""
    e5 = EncoderSpec(model="intfloat/multilingual-e5-large").resolved()
    assert (e5.pooling, e5.query_prefix, e5.doc_prefix) == ("mean", "query: ", "passage: ")
    plain = EncoderSpec(model="/models/all-MiniLM-L6-v2", query_prefix="Q: ").resolved()
    assert (plain.pooling, plain.query_prefix, plain.doc_prefix) == ("auto", "Q: ", "")
    with pytest.raises(ValueError, match="pooling\n  Input should be .* input_value='max'"):
        EncoderSpec(model="m", pooling="max")


# -- the Encoder module -------------------------------------------------------------------------
def with_st_config(src: str, dest: Path, pooling: dict, modules: list[str] | None = None) -> str:
    """A copy of model `src` with a sentence-transformers config naming its pooling."""
    shutil.copytree(src, dest)
    kinds = modules or ["Transformer", "Pooling", "Normalize"]
    paths = {"Transformer": "", "Pooling": "1_Pooling"}
    listed = [
        {"idx": i, "name": str(i), "path": paths.get(k, f"{i}_{k}"), "type": f"st.models.{k}"}
        for i, k in enumerate(kinds)
    ]
    (dest / "modules.json").write_text(json.dumps(listed))
    (dest / "1_Pooling").mkdir()
    (dest / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return str(dest)


def test_auto_pooling_resolves_from_the_sentence_transformers_config(minilm, tiny_models, tmp_path):
    st = read_sentence_transformers_config(EncoderSpec(model=minilm))
    assert (st.pooling, st.max_seq_length) == ("mean", 256)  # MiniLM's legacy boolean flags
    enc = Encoder.load(minilm)
    assert (enc.pooling, enc.max_length) == ("mean", 256)
    assert DenseEncoder(EncoderSpec(model=minilm)).spec.pooling == "mean"
    # a config-built decoder whose name matches no preset: its own config decides
    plain = with_st_config(tiny_models["qwen"], tmp_path / "decoder", {"pooling_mode": "lasttoken"})
    assert Encoder.load(plain).pooling == "last_token"
    assert DenseEncoder(EncoderSpec(model=plain)).spec.pooling == "last_token"
    cls = with_st_config(tiny_models["qwen"], tmp_path / "cls", {"pooling_mode_cls_token": True})
    assert Encoder.build(cls).pooling == "cls"
    # no config: the name's preset (Qwen3-Embedding), else mean as sentence-transformers does
    assert Encoder.load(tiny_models["qwen"]).pooling == "last_token"
    shutil.copytree(tiny_models["qwen"], tmp_path / "nameless")
    assert Encoder.load(str(tmp_path / "nameless")).pooling == "mean"
    assert Encoder.load(plain, "cls").pooling == "cls"  # explicit wins


def test_unknown_pooling_modes_raise_naming_them(tiny_models, tmp_path):
    with pytest.raises(ValueError, match="pooling\n  Input should be .* input_value='max'"):
        Encoder.build(tiny_models["qwen"], pooling="max")
    weighted = with_st_config(tiny_models["qwen"], tmp_path / "w", {"pooling_mode": "weightedmean"})
    with pytest.raises(ValueError, match="unknown pooling 'weightedmean' in .*w"):
        Encoder.load(weighted)
    dense = with_st_config(
        tiny_models["qwen"],
        tmp_path / "d",
        {"pooling_mode": "mean"},
        ["Transformer", "Pooling", "Dense", "Normalize"],
    )
    with pytest.raises(ValueError, match="module st.models.Dense .* not supported"):
        Encoder.load(dense)


def test_build_trains_with_gradients_and_equals_the_inference_encoder(minilm_encoder, minilm):
    enc = minilm_encoder
    assert enc.training and all(p.requires_grad for p in enc.parameters())
    enc.eval()  # no dropout, so the two paths see the same network; gradients stay on
    texts = ["The cats are sitting on the mat.", "Quantum entanglement of photon pairs."]
    out = enc(enc.tokenize(texts))  # (2, 384)
    assert out.shape == (2, 384) and out.requires_grad
    (out[0] @ out[1]).backward()
    assert enc.backbone.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    inference = DenseEncoder(EncoderSpec(model=minilm))
    assert not inference.model.training
    assert not any(p.requires_grad for p in inference.model.parameters())
    np.testing.assert_allclose(out.detach().numpy(), inference.encode_docs(texts), atol=1e-6)


def test_splade_encoder_module(tiny_models):
    enc = Encoder.build(tiny_models["splade"], pooling="splade")
    out = enc(enc.tokenize(DOCS[:2]))  # (2, V)
    assert out.shape == (2, enc.dim) and out.requires_grad and (out >= 0).all()
    inference = SpladeEncoder(EncoderSpec(model=tiny_models["splade"]))
    enc.eval()
    np.testing.assert_allclose(
        enc(enc.tokenize(DOCS[:2])).detach().numpy(),
        inference.encode_docs(DOCS[:2]).toarray(),
        atol=1e-6,
    )


# -- encoders and dense/splade retrievers -----------------------------------------------------
def test_last_token_encoder_is_padding_invariant(tiny_models):
    enc = DenseEncoder(EncoderSpec(model=tiny_models["qwen"], batch_size=8))
    assert enc.spec.pooling == "last_token"  # from the Qwen3-Embedding name
    texts = ["short", "a much longer text with quite a few more words in it", "mid length one"]
    together = enc.encode_docs(texts)
    alone = np.concatenate([enc.encode_docs([t]) for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1, atol=1e-5)
    # the query side carries the instruction, so it differs from the same text as a document
    assert not np.allclose(enc.encode_queries(["short"]), together[:1])


def test_splade_retriever_scores_are_sparse_dot_products(tiny_models):
    spec = EncoderSpec(model=tiny_models["splade"], batch_size=2)
    enc = SpladeEncoder(spec)
    docs = enc.encode_docs(DOCS)
    assert docs.shape == (5, enc.dim) and (docs.data > 0).all()
    r = make_retriever("splade", tiny_models["splade"])
    r.index(DOCS)
    q = ["photon quantum", "cats"]
    expected = (enc.encode_queries(q) @ docs.T).toarray()
    got = r.score(q, pad_pools([[0, 1, 2, 3, 4], [4, 0]]))
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-5)
    np.testing.assert_allclose(got[1, :2], expected[1, [4, 0]], rtol=1e-5)
    assert got[1, 2] == -np.inf
    idx, val = r.search(q, 3)
    assert idx[0].tolist() == np.argsort(-expected[0], kind="stable")[:3].tolist()


def test_dense_minilm_exact_and_faiss_agree(minilm):
    numpy_r = make_retriever("dense", minilm)
    faiss_r = make_retriever("dense", minilm, RetrieverOptions(search_backend="faiss"))
    for r in (numpy_r, faiss_r):
        r.index(DOCS)
    q = ["kittens on a rug", "light particles and entanglement"]
    a_idx, a_val = numpy_r.search(q, 3)
    b_idx, b_val = faiss_r.search(q, 3)
    assert a_idx.tolist() == b_idx.tolist()
    np.testing.assert_allclose(a_val, b_val, atol=1e-5)
    assert a_idx[0, 0] == 0 and a_idx[1, 0] == 2  # MiniLM gets the obvious ones
    scores = numpy_r.score(q, pad_pools([[0, 2], [2, 0]]))
    np.testing.assert_allclose(scores[0], a_val[0][[0]].tolist() + [scores[0][1]], atol=1e-6)


@pytest.mark.slow
def test_ray_actor_pool_encoding_equals_in_process(ray_session, minilm, tiny_models):
    """The Ray Data actor pool (2 actors, several blocks) gives the in-process embeddings."""
    from cpr_ray.retrieval.ray_encode import encode_with_ray
    from cpr_ray.retrieval.spec import RayEncodeOptions

    texts = [f"{d} (variant {i})" for i in range(12) for d in DOCS]  # 60 texts, 8 blocks
    spec = EncoderSpec(model=minilm, threads=1)
    # dense through the retriever, which switches to Ray at ray_min_docs and hands its options
    # to `encode_with_ray` (one actor pool: each actor's start is most of this test's time)
    r = make_retriever(
        "dense",
        minilm,
        RetrieverOptions(
            encoder=spec, ray_min_docs=10, ray=RayEncodeOptions(actors=2, batch_rows=8)
        ),
    )
    r.index(texts)
    assert r.encoded_with_ray
    np.testing.assert_allclose(r.docs, DenseEncoder(spec).encode_docs(texts), atol=1e-5)
    # SPLADE's sparse rows, straight through encode_with_ray
    opts = RayEncodeOptions(actors=2, batch_rows=8, rows_per_block=16)
    sspec = EncoderSpec(model=tiny_models["splade"], threads=1)
    enc = SpladeEncoder(sspec)
    sparse = encode_with_ray(texts[:20], sspec, "splade", opts, vocab_size=enc.dim)
    np.testing.assert_allclose(sparse.toarray(), enc.encode_docs(texts[:20]).toarray(), atol=1e-5)


def test_an_encoder_actor_asks_ray_for_its_weights_forward_pass_and_rows(ray_session, tiny_bert):
    """The memory an encoder pool's actors declare to Ray: the weights counted exactly (the meta
    model's parameters are the loaded model's) in the spec's dtype; on a CPU a forward pass that
    grows with the texts per pass, stops at the token budget and adds SPLADE's logits; on a GPU
    no forward pass (it is in GPU memory)."""
    import ray
    from transformers import AutoModel

    from cpr_ray.retrieval.ray_encode import actor_memory, encode_dataset, model_shape
    from cpr_ray.retrieval.spec import RayEncodeOptions

    spec = EncoderSpec(model=tiny_bert, max_length=64, batch_size=8)
    shape = model_shape(spec)
    assert shape.parameters == sum(
        p.numel() for p in AutoModel.from_pretrained(tiny_bert).parameters()
    )
    gpu = actor_memory(shape, spec, "dense", 16, on_gpu=True)
    half = actor_memory(shape, spec.with_updates(dtype="bfloat16"), "dense", 16, on_gpu=True)
    assert gpu - half == 2 * shape.parameters
    cpu = actor_memory(shape, spec, "dense", 16, on_gpu=False)
    twice = spec.with_updates(batch_size=16)
    assert actor_memory(shape, twice, "dense", 16, on_gpu=False) - gpu == 2 * (cpu - gpu) > 0
    capped = twice.with_updates(token_budget=8 * 64)
    assert actor_memory(shape, capped, "dense", 16, on_gpu=False) == cpu
    splade = actor_memory(shape, spec, "splade", 16, on_gpu=False)
    assert splade - cpu == 8 * 64 * shape.vocab * 4
    assert actor_memory(shape, spec, "dense", 32, on_gpu=False) > cpu  # a call's rows
    # the one place that builds encoder pools declares it
    options = RayEncodeOptions(batch_rows=16)
    pool = encode_dataset(ray.data.from_items([{"text": "a"}]), spec, "dense", options)
    assert pool._logical_plan.dag.ray_remote_args["memory"] == cpu


def test_model_path_is_checked(tmp_path: Path):
    r = make_retriever(
        "dense",
        str(tmp_path / "no-such-model"),
        RetrieverOptions(encoder=EncoderSpec(model="", pooling="mean")),
    )
    with pytest.raises(ValueError, match=r"encoder.model: .*no-such-model \(read as a folder\)"):
        r.index(DOCS)
    with pytest.raises(UserError):  # the CLI and jobs print it in one line and exit 2
        r.index(DOCS)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_an_encoder_in_half_precision_encodes_as_float32_does(tiny_models, dtype):
    """`encoder.dtype`: the weights load in that dtype, and the vectors (float32, as every
    store keeps them) point where float32's do, within half precision's rounding."""
    spec = EncoderSpec(model=tiny_models["qwen"])
    full = DenseEncoder(spec).encode_docs(DOCS)
    encoder = DenseEncoder(spec.with_updates(dtype=dtype))
    assert {p.dtype for p in encoder.model.parameters()} == {getattr(torch, dtype)}
    half = encoder.encode_docs(DOCS)
    assert half.dtype == np.float32 and half.shape == full.shape
    assert not np.array_equal(half, full)  # computed in half precision, not float32
    # both L2-normalised; measured 1 - 1e-5 (bfloat16) and 1 - 1e-7 (float16)
    cosine = (half * full).sum(axis=1)
    assert cosine.min() > 0.999, cosine
