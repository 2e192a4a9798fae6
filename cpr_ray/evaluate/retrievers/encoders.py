"""Text encoders for evaluation: dense (any model path or hub name) and SPLADE.

An :class:`EncoderSpec` is the whole configuration and is what travels to Ray actors; the model
loads where the encoder is built (on the actor), never on the driver by accident.

Dense models load two ways:

- ``pooling="auto"``: through sentence-transformers, which applies the model's own pooling and
  normalisation config (MiniLM, most ST checkpoints);
- ``pooling`` in ``mean | cls | last_token``: a plain transformers model pooled by
  ``pooling.py`` (what decoder embedders such as Qwen3-Embedding need).

Instructions are plain prefixes. Unset ones come from ``PRESETS`` by model name (E5's
``query: ``/``passage: ``, Qwen3-Embedding's ``Instruct: …\\nQuery: ``, BGE's search prompt), so a
hub name gets the prompt it was trained with; an empty string means "no prefix".
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import scipy.sparse as sp

from cpr_ray.evaluate.retrievers.pooling import POOLINGS

QWEN3_TASK = "Given a research problem, retrieve papers whose ideas could help solve it"

# lower-case name fragment -> (pooling, query prefix, document prefix)
PRESETS: dict[str, tuple[str, str, str]] = {
    "qwen3-embedding": ("last_token", f"Instruct: {QWEN3_TASK}\nQuery: ", ""),
    "e5": ("mean", "query: ", "passage: "),
    "bge-m3": ("cls", "", ""),
    "bge-": ("cls", "Represent this sentence for searching relevant passages: ", ""),
    "specter": ("cls", "", ""),
    "scincl": ("cls", "", ""),
}


@dataclass(frozen=True)
class EncoderSpec:
    model: str  # local path or hub name
    pooling: str = "auto"  # auto | mean | cls | last_token (ignored by SPLADE)
    query_prefix: str | None = None  # None: from PRESETS, else none
    doc_prefix: str | None = None
    max_length: int = 512
    normalize: bool = True
    batch_size: int = 32
    device: str = "cpu"
    threads: int | None = None  # torch intra-op threads; None leaves torch's default

    def __post_init__(self) -> None:
        if self.pooling not in ("auto", *POOLINGS):
            raise ValueError(
                f"unknown pooling {self.pooling!r}; known: auto, {', '.join(POOLINGS)}"
            )
        if self.max_length < 8 or self.batch_size < 1:
            raise ValueError("max_length must be >= 8 and batch_size >= 1")

    def resolved(self) -> EncoderSpec:
        """Fill unset pooling/prefixes from the preset matching the model name, if any."""
        name = self.model.rstrip("/").rsplit("/", 1)[-1].lower()  # hub repo or folder name
        for fragment, (pooling, qp, dp) in PRESETS.items():
            if name.startswith(fragment) or f"-{fragment}" in name:
                return replace(
                    self,
                    pooling=pooling if self.pooling == "auto" else self.pooling,
                    query_prefix=qp if self.query_prefix is None else self.query_prefix,
                    doc_prefix=dp if self.doc_prefix is None else self.doc_prefix,
                )
        return replace(self, query_prefix=self.query_prefix or "", doc_prefix=self.doc_prefix or "")


def _torch_threads(spec: EncoderSpec) -> None:
    import torch

    if spec.threads:
        torch.set_num_threads(spec.threads)


class DenseEncoder:
    """Texts -> float32 embeddings (n, d), L2-normalised when `spec.normalize`."""

    def __init__(self, spec: EncoderSpec) -> None:
        self.spec = spec.resolved()
        _torch_threads(self.spec)
        if self.spec.pooling == "auto":
            from sentence_transformers import SentenceTransformer

            self._st = SentenceTransformer(self.spec.model, device=self.spec.device)
            self._st.max_seq_length = min(self.spec.max_length, self._st.max_seq_length or 10**9)
        else:
            from transformers import AutoModel, AutoTokenizer

            self._st = None
            self._tok = AutoTokenizer.from_pretrained(self.spec.model)
            self._model = AutoModel.from_pretrained(self.spec.model).to(self.spec.device).eval()

    @property
    def dim(self) -> int:
        if self._st is not None:
            return int(self._st.get_sentence_embedding_dimension())
        return int(self._model.config.hidden_size)

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode([self.spec.query_prefix + t for t in texts])

    def encode_docs(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode([self.spec.doc_prefix + t for t in texts])

    def _encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self._st is not None:
            out = self._st.encode(
                texts,
                batch_size=self.spec.batch_size,
                convert_to_numpy=True,
                normalize_embeddings=self.spec.normalize,
                show_progress_bar=False,
            )
            return np.asarray(out, dtype=np.float32)
        import torch

        from cpr_ray.evaluate.retrievers.pooling import pool

        parts = []
        with torch.inference_mode():
            for batch in _batches(self._tok, texts, self.spec):
                hidden = self._model(**batch).last_hidden_state  # (b, L, d)
                vec = pool(self.spec.pooling, hidden, batch["attention_mask"]).float()
                if self.spec.normalize:
                    vec = torch.nn.functional.normalize(vec, dim=-1)
                parts.append(vec.cpu().numpy())
        return np.concatenate(parts).astype(np.float32, copy=False)


def _batches(tok: Any, texts: list[str], spec: EncoderSpec) -> Iterator[Any]:
    """Tokenised batches of `texts` on the spec's device (shared by dense and SPLADE)."""
    for start in range(0, len(texts), spec.batch_size):
        yield tok(
            texts[start : start + spec.batch_size],
            padding=True,
            truncation=True,
            max_length=spec.max_length,
            return_tensors="pt",
        ).to(spec.device)


class SpladeEncoder:
    """Texts -> sparse vocabulary-sized vectors (scipy CSR, float32)."""

    def __init__(self, spec: EncoderSpec) -> None:
        from transformers import AutoModelForMaskedLM, AutoTokenizer

        self.spec = replace(
            spec, query_prefix=spec.query_prefix or "", doc_prefix=spec.doc_prefix or ""
        )
        _torch_threads(self.spec)
        self._tok = AutoTokenizer.from_pretrained(spec.model)
        self._model = AutoModelForMaskedLM.from_pretrained(spec.model).to(spec.device).eval()

    @property
    def dim(self) -> int:
        return int(self._model.config.vocab_size)

    def encode_queries(self, texts: Sequence[str]) -> sp.csr_matrix:
        return self._encode([self.spec.query_prefix + t for t in texts])

    def encode_docs(self, texts: Sequence[str]) -> sp.csr_matrix:
        return self._encode([self.spec.doc_prefix + t for t in texts])

    def _encode(self, texts: list[str]) -> sp.csr_matrix:
        import torch

        from cpr_ray.evaluate.retrievers.pooling import splade_pool

        parts = [sp.csr_matrix((0, self.dim), dtype=np.float32)]
        with torch.inference_mode():
            for batch in _batches(self._tok, texts, self.spec):
                logits = self._model(**batch).logits  # (b, L, V)
                vec = splade_pool(logits, batch["attention_mask"]).float().cpu().numpy()
                parts.append(sp.csr_matrix(vec, dtype=np.float32))
        return sp.vstack(parts, format="csr")
