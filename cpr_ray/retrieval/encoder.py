"""The encoder: a transformer and its token pooling as one torch module, and text encoders over it.

:class:`Encoder` is the one model every stage encodes with. ``Encoder.build`` gives a trainable
module (train mode, gradients on) for fine-tuning; ``Encoder.load`` the same module for inference
(eval mode, no gradients). Both pool in ``forward``, so training, evaluation, candidate pooling
and search cannot pool one model differently.

Pooling ``auto`` resolves to an explicit mode when the model loads: the model's
sentence-transformers config (``modules.json`` and its Pooling module's ``config.json``) names
it; a model without one takes the preset its name matches (``spec.PRESETS``: a Qwen3-Embedding
checkpoint saved by plain transformers still pools its last token), else mean pooling, which is
what sentence-transformers itself does with a plain transformers checkpoint. That config's
``max_seq_length`` (the length the model was trained at) caps ``max_length`` too, and its
``config_sentence_transformers.json`` prompts are the instructions of a model no preset names
(a model this package fine-tuned and saved with ``Encoder.save_sentence_transformers``, which
writes that same format, so ``SentenceTransformer(path)`` loads it as it was trained). ``splade``
loads the masked-LM head instead and pools it into a vocabulary-sized vector. Models load
through the loader (``model_source``), with the spec's loading settings: a local folder, or a
hub name where the hub can be reached. A model whose architecture ships as its own Python code
(``auto_map`` in its config, e.g. llama-embed-nemotron) loads only with ``trust_remote_code``
(``encoder.trust_remote_code``), which runs that code.

:class:`DenseEncoder` and :class:`SpladeEncoder` encode lists of texts in batches with the query
and document instructions of an :class:`~cpr_ray.retrieval.spec.EncoderSpec`. The spec is what
travels to Ray actors; the model loads where the text encoder is built (on the actor).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from torch import nn

from cpr_ray.retrieval.model_source import ModelError, loading_errors, model_json, pretrained
from cpr_ray.retrieval.spec import POOLINGS, EncoderSpec, preset
from cpr_ray.retrieval.token_pooling import pool, splade_pool

ENCODER_POOLINGS = (*POOLINGS, "splade")

# sentence-transformers pooling mode -> ours; its older configs name the mode by boolean flags
ST_POOLINGS = {"mean": "mean", "cls": "cls", "lasttoken": "last_token"}
ST_POOLING_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
# what Encoder reproduces of a sentence-transformers pipeline (normalising is EncoderSpec's)
ST_MODULES = ("Transformer", "Pooling", "Normalize")
SORT_CHUNK = 8192  # texts tokenised and length-sorted together


def position_limits(backbone: nn.Module, tokenizer: Any) -> list[int]:
    """The longest inputs the model takes: its position table and its tokenizer's declared
    maximum (RoBERTa's table holds two more than it can use), where they are known. A longer
    `max_length` (train.max_length is 1,024 by default, BERT's table 512) would fail on the
    first long text."""
    limits = [getattr(backbone.config, "max_position_embeddings", None)]
    limits.append(getattr(tokenizer, "model_max_length", None))
    return [int(n) for n in limits if isinstance(n, int) and 0 < n < 1_000_000]


@dataclass(frozen=True)
class SentenceTransformersConfig:
    """What a sentence-transformers checkpoint says about its pooling (None: it says nothing)."""

    pooling: str | None = None  # one of POOLINGS
    max_seq_length: int | None = None
    query_prompt: str | None = None  # the `query` and `document` prompts it was trained with
    document_prompt: str | None = None


def _st_pooling(model: str, config: Mapping[str, Any]) -> str:
    mode = config.get("pooling_mode")
    if mode is None:
        mode = [name for flag, name in ST_POOLING_FLAGS.items() if config.get(flag)]
    if isinstance(mode, list):
        mode = mode[0] if len(mode) == 1 else "+".join(mode)
    if mode not in ST_POOLINGS:
        raise ModelError(
            f"unknown pooling {mode!r} in the sentence-transformers config of {model}; "
            f"known: {', '.join(ST_POOLINGS)}"
        )
    return ST_POOLINGS[mode]


def read_sentence_transformers_config(spec: EncoderSpec) -> SentenceTransformersConfig:
    """The pooling and maximum length the spec's model declares as a sentence-transformers
    checkpoint.

    A module this encoder would not reproduce (a Dense projection, say) raises, since the
    embeddings would silently differ from the model's.
    """
    model = spec.model
    modules = model_json(spec, "modules.json")
    if modules is None:
        return SentenceTransformersConfig()
    pooling = None
    for module in modules:
        kind = module["type"].rsplit(".", 1)[-1]
        if kind not in ST_MODULES or (kind == "Transformer" and module.get("path")):
            raise ModelError(
                f"{model}: sentence-transformers module {module['type']} at "
                f"{module.get('path')!r} is not supported; supported: {', '.join(ST_MODULES)} "
                "(the transformer at the model's root)"
            )
        if kind == "Pooling":
            pooling = _st_pooling(model, model_json(spec, f"{module['path']}/config.json") or {})
    bert = model_json(spec, "sentence_bert_config.json") or {}
    prompts = (model_json(spec, "config_sentence_transformers.json") or {}).get("prompts") or {}
    return SentenceTransformersConfig(
        pooling=pooling,
        max_seq_length=bert.get("max_seq_length"),
        query_prompt=prompts.get("query"),
        document_prompt=prompts.get("document", prompts.get("passage")),
    )


class Encoder(nn.Module):
    """Tokenised texts -> one vector per text: dense (b, hidden), L2-normalised when `normalize`,
    or SPLADE (b, vocabulary)."""

    # a transformers model, or PEFT's wrapper of one: its config, save_pretrained and heads are
    # theirs, which nn.Module's attribute typing (Tensor | Module) does not know
    backbone: Any

    def __init__(
        self,
        backbone: nn.Module,
        tokenizer: Any,
        pooling: str,
        *,
        normalize: bool = True,
        max_length: int = 512,
        prompts: tuple[str | None, str | None] = (None, None),
    ) -> None:
        super().__init__()
        if pooling not in ENCODER_POOLINGS:
            raise ValueError(f"unknown pooling {pooling!r}; known: {', '.join(ENCODER_POOLINGS)}")
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.normalize = normalize and pooling != "splade"
        self.max_length = max_length
        # (query, document) prompts the model's sentence-transformers config declares, if any
        self.prompts = prompts

    @classmethod
    def build(cls, model: EncoderSpec | str, pooling: str | None = None, **fields: Any) -> Encoder:
        """A trainable encoder (train mode, gradients on every parameter) of `model`: a spec,
        or a model name with the spec's `fields` (max_length, dtype, trust_remote_code, …).
        `pooling` overrides the spec's; ``splade`` loads the masked-LM head instead. The spec's
        device is for `load`: a trainable encoder stays where it loads (the CPU)."""
        spec, splade = _spec_of(model, pooling, fields)
        return cls._from_pretrained(spec, splade).train()

    @classmethod
    def load(cls, model: EncoderSpec | str, pooling: str | None = None, **fields: Any) -> Encoder:
        """An encoder for inference: eval mode, no gradients, on the spec's device (auto: CUDA
        where there is a GPU, else CPU; a model name without `device` in `fields`: the CPU);
        `model`, `pooling` and `fields` as for `build`."""
        if not isinstance(model, EncoderSpec):
            fields.setdefault("device", "cpu")
        spec, splade = _spec_of(model, pooling, fields)
        enc = cls._from_pretrained(spec, splade)
        enc.requires_grad_(False)
        device = spec.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        return enc.to(device).eval()

    @classmethod
    def _from_pretrained(cls, spec: EncoderSpec, splade: bool) -> Encoder:
        tokenizer, backbone = pretrained(spec, masked_lm=splade)
        pooling: str = "splade" if splade else spec.pooling
        max_length = spec.max_length
        prompts: tuple[str | None, str | None] = (None, None)
        if not splade:
            with loading_errors(spec):
                st = read_sentence_transformers_config(spec)
            if pooling == "auto":
                named = preset(spec.model)
                pooling = st.pooling or (named[0] if named else "mean")
            max_length = min(max_length, st.max_seq_length or max_length)
            prompts = (st.query_prompt, st.document_prompt)
        return cls(
            backbone,
            tokenizer,
            pooling,
            normalize=spec.normalize,
            max_length=min([max_length, *position_limits(backbone, tokenizer)]),
            prompts=prompts,
        )

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dim(self) -> int:
        config = self.backbone.config
        return int(config.vocab_size if self.pooling == "splade" else config.hidden_size)

    def tokenize(self, texts: Sequence[str]) -> Any:
        """A padded, truncated batch (a transformers BatchEncoding of (b, L) tensors)."""
        return self.tokenizer(
            list(texts),
            padding=True,
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
        )

    def save_sentence_transformers(
        self, path: str | Path, *, query_prefix: str = "", doc_prefix: str = ""
    ) -> None:
        """Write the model as a sentence-transformers folder with this pooling and these prompts.

        The classic layout (``sentence_transformers.models.*`` module types, pooling flags),
        which sentence-transformers 6 loads as well as older releases; ``Encoder.load`` and
        ``DenseEncoder`` read the pooling and, for a folder no preset names, the prompts back.
        """
        if self.pooling == "splade":
            raise ValueError("a SPLADE encoder has no sentence-transformers dense form")
        if hasattr(self.backbone, "peft_config"):  # its save_pretrained writes adapters alone
            raise ValueError("an encoder with LoRA adapters: merge them first (train/lora.py)")
        out = Path(path)
        (out / "1_Pooling").mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        modules = [("", "Transformer"), ("1_Pooling", "Pooling")]
        modules += [("2_Normalize", "Normalize")] if self.normalize else []
        files: dict[str, Any] = {
            "modules.json": [
                {"idx": i, "name": str(i), "path": p, "type": f"sentence_transformers.models.{t}"}
                for i, (p, t) in enumerate(modules)
            ],
            "sentence_bert_config.json": {
                "max_seq_length": self.max_length,
                "do_lower_case": False,
            },
            "config_sentence_transformers.json": {
                "prompts": {"query": query_prefix, "document": doc_prefix},
                "default_prompt_name": None,
                "similarity_fn_name": "cosine" if self.normalize else "dot",
            },
            "1_Pooling/config.json": {
                "word_embedding_dimension": self.dim,
                **{
                    flag: ST_POOLINGS.get(mode) == self.pooling
                    for flag, mode in ST_POOLING_FLAGS.items()
                },
                "include_prompt": True,
            },
        }
        for name, content in files.items():
            (out / name).write_text(json.dumps(content, indent=2))

    def forward(self, tokenized: Mapping[str, torch.Tensor]) -> torch.Tensor:
        out = self.backbone(**tokenized)
        mask = tokenized["attention_mask"]  # (b, L)
        if self.pooling == "splade":
            return splade_pool(out.logits, mask).float()  # (b, V)
        vec = pool(self.pooling, out.last_hidden_state, mask).float()  # (b, d)
        return nn.functional.normalize(vec, dim=-1) if self.normalize else vec


def batch_bounds(
    lengths: np.ndarray, batch_size: int, token_budget: int | None
) -> list[tuple[int, int]]:
    """[start, stop) of each batch over token lengths sorted longest first.

    A batch holds at most `batch_size` texts and, with a budget, at most `token_budget` padded
    tokens (its first text is its longest, so it pads to that one's length); a text longer
    than the budget goes alone.
    """
    bounds, start, n = [], 0, len(lengths)
    while start < n:
        size = batch_size
        if token_budget is not None:
            size = max(1, min(batch_size, token_budget // max(1, int(lengths[start]))))
        bounds.append((start, min(n, start + size)))
        start += size
    return bounds


def _spec_of(
    model: EncoderSpec | str, pooling: str | None, fields: dict[str, Any]
) -> tuple[EncoderSpec, bool]:
    """The spec `Encoder.build` and `Encoder.load` load, and whether as SPLADE."""
    splade = pooling == "splade"
    if isinstance(model, EncoderSpec):
        spec = model.with_updates(**fields)
    else:
        spec = EncoderSpec(model=model, **fields)
    return (spec.with_updates(pooling=pooling) if pooling and not splade else spec), splade


def with_model_prompts(spec: EncoderSpec, prompts: tuple[str | None, str | None]) -> EncoderSpec:
    """Unset instructions from the (query, document) prompts the model was saved with.

    Only for a model no preset names: a preset's instruction is this task's (Qwen3-Embedding's
    own saved prompt is for web search), while a folder this package fine-tuned carries the
    instructions it was trained with. Set instructions always win.
    """
    if preset(spec.model) is not None:
        return spec
    query, document = prompts
    return spec.with_updates(
        query_prefix=query if spec.query_prefix is None else spec.query_prefix,
        doc_prefix=document if spec.doc_prefix is None else spec.doc_prefix,
    )


def with_instructions(spec: EncoderSpec) -> EncoderSpec:
    """The spec with the query and document prefixes it encodes with, chosen exactly as a
    `DenseEncoder` chooses them (set, the model's saved prompts, its preset, else none): what
    training trains with and saves into its model. Its pooling stays as set."""
    if preset(spec.model) is None and (spec.query_prefix is None or spec.doc_prefix is None):
        st = read_sentence_transformers_config(spec)
        spec = with_model_prompts(spec, (st.query_prompt, st.document_prompt))
    resolved = spec.resolved()
    return spec.with_updates(
        query_prefix=resolved.query_prefix or "", doc_prefix=resolved.doc_prefix or ""
    )


class _TextEncoder:
    """Lists of texts -> embeddings, batch by batch, with the spec's query/document prefixes.

    All texts are tokenised in one call; batches are taken longest first by token count (less
    padding, as sentence-transformers does by characters), each cropped to its own longest text,
    so a batch's tensors are exactly what tokenising it alone gives; results come back in input
    order.
    """

    def __init__(self, spec: EncoderSpec, model: Encoder) -> None:
        self.spec = spec
        self.model = model

    @property
    def dim(self) -> int:
        return self.model.dim

    def _embed(self, texts: list[str]) -> tuple[list[np.ndarray], np.ndarray]:
        """Per batch, its embeddings; and the order the texts were encoded in."""
        parts, orders = [], []
        for offset in range(0, len(texts), SORT_CHUNK):  # bounds the tokenised tensors' memory
            chunk_parts, order = self._embed_chunk(texts[offset : offset + SORT_CHUNK])
            parts += chunk_parts
            orders.append(order + offset)
        return parts, np.concatenate(orders) if orders else np.zeros(0, np.int64)

    def _embed_chunk(self, texts: list[str]) -> tuple[list[np.ndarray], np.ndarray]:
        tokenized = self.model.tokenize(texts)  # (n, L) padded to the longest of all
        lengths = tokenized["attention_mask"].sum(dim=1).numpy()  # (n,)
        order = np.argsort(-lengths, kind="stable")
        width = tokenized["attention_mask"].shape[1]
        left = self.model.tokenizer.padding_side == "left"
        parts = []
        with torch.inference_mode():
            for start, stop in batch_bounds(
                lengths[order], self.spec.batch_size, self.spec.token_budget
            ):
                rows = torch.from_numpy(order[start:stop])
                longest = int(lengths[order[start]])
                cols = slice(width - longest, width) if left else slice(0, longest)
                batch = {k: v[rows][:, cols].to(self.model.device) for k, v in tokenized.items()}
                parts.append(self.model(batch).cpu().numpy())
        return parts, order


def _torch_threads(spec: EncoderSpec) -> None:
    if spec.threads:
        torch.set_num_threads(spec.threads)


class DenseEncoder(_TextEncoder):
    """Texts -> float32 embeddings (n, d), L2-normalised when `spec.normalize`.

    ``spec.pooling`` is the explicit mode the model was loaded with.
    """

    def __init__(self, spec: EncoderSpec) -> None:
        _torch_threads(spec)
        model = Encoder.load(spec)
        spec = with_model_prompts(spec, model.prompts)
        super().__init__(spec.resolved().with_updates(pooling=model.pooling), model)

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode([(self.spec.query_prefix or "") + t for t in texts])

    def encode_docs(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode([(self.spec.doc_prefix or "") + t for t in texts])

    def _encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        parts, order = self._embed(texts)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        out[order] = np.concatenate(parts)
        return out


class SpladeEncoder(_TextEncoder):
    """Texts -> sparse vocabulary-sized vectors (scipy CSR, float32)."""

    def __init__(self, spec: EncoderSpec) -> None:
        spec = spec.with_updates(
            query_prefix=spec.query_prefix or "", doc_prefix=spec.doc_prefix or ""
        )
        _torch_threads(spec)
        super().__init__(spec, Encoder.load(spec, "splade"))

    def encode_queries(self, texts: Sequence[str]) -> sp.csr_matrix:
        return self._encode([(self.spec.query_prefix or "") + t for t in texts])

    def encode_docs(self, texts: Sequence[str]) -> sp.csr_matrix:
        return self._encode([(self.spec.doc_prefix or "") + t for t in texts])

    def _encode(self, texts: list[str]) -> sp.csr_matrix:
        parts, order = self._embed(texts)
        encoded = sp.vstack(
            [sp.csr_matrix(np.zeros((0, self.dim), np.float32))]
            + [sp.csr_matrix(p, dtype=np.float32) for p in parts],
            format="csr",
        )
        return encoded[np.argsort(order)]  # rows back in input order
