"""What every encoder and retriever is configured by: the encoder's spec, the actor pool it
encodes a large corpus on, and a retriever's options.

They are the interface between the config tree and this package: the spec and the actor pool
extend the `encoder:` section's own parts (`cpr_ray.config.encoder`), so they keep its names and
its checks, and the options are derived from the sections by name (`derive`). They are what
travels to Ray actors, so they hold only plain values and import nothing heavy.

Instructions are plain prefixes. Unset ones come from ``PRESETS`` by model name (E5's
``query: ``/``passage: ``, Qwen3-Embedding's ``Instruct: …\\nQuery: ``, BGE's search prompt), so a
hub name gets the prompt it was trained with; an empty string means "no prefix".
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, get_args

from pydantic import Field

from cpr_ray.config.encoder import EncoderActors, EncoderSettings, TokenPooling
from cpr_ray.config.evaluation import SearchBackend
from cpr_ray.retrieval.fusion import Fusion
from cpr_ray.sections import derive

if TYPE_CHECKING:
    from cpr_ray.config import Config

POOLINGS: tuple[str, ...] = get_args(TokenPooling)
# what decides a document's vector (device, batch size and threads do not)
VECTOR_KEYS = ("model", "pooling", "doc_prefix", "max_length", "normalize", "dtype")
FINGERPRINT_BYTES = 1 << 20

QWEN3_TASK = "Given a research problem, retrieve papers whose ideas could help solve it"

# lower-case name fragment -> (pooling, query prefix, document prefix)
PRESETS: dict[str, tuple[str, str, str]] = {
    "qwen3-embedding": ("last_token", f"Instruct: {QWEN3_TASK}\nQuery: ", ""),
    # bidirectional Llama, mean-pooled, Qwen3-style instructions (its model card)
    "llama-embed-nemotron": ("mean", f"Instruct: {QWEN3_TASK}\nQuery: ", ""),
    "e5": ("mean", "query: ", "passage: "),
    "bge-m3": ("cls", "", ""),
    "bge-": ("cls", "Represent this sentence for searching relevant passages: ", ""),
    "specter": ("cls", "", ""),
    "scincl": ("cls", "", ""),
}


def preset(model: str) -> tuple[str, str, str] | None:
    """(pooling, query prefix, document prefix) of the preset the model's name matches."""
    name = model.rstrip("/").rsplit("/", 1)[-1].lower()  # hub repo or folder name
    for fragment, values in PRESETS.items():
        if name.startswith(fragment) or f"-{fragment}" in name:
            return values
    return None


class EncoderSpec(EncoderSettings):
    """One encoder as it is built and run: the `encoder:` section's settings (declared and
    checked there, `EncoderSettings`) with a model always named and the settings only code
    sets. A pydantic model, so a value is checked however a spec is made: from the config, by
    `with_updates`, or from an index's manifest."""

    model: str  # local path or hub name
    normalize: bool = True
    threads: int | None = None  # torch intra-op threads; None leaves torch's default
    # padded tokens per forward pass, at most (texts sorted by token length fill batches up to
    # it, so short texts go in big batches and long ones in small); None: batch_size alone
    token_budget: int | None = Field(None, ge=8)
    # the config key that named the model, for the one line a wrong name gives (not part of
    # what the spec is: no identity or dump holds it)
    setting: str = Field("encoder.model", exclude=True)

    @classmethod
    def from_config(
        cls, enc: EncoderSettings, model: str | None = None, **overrides: Any
    ) -> EncoderSpec:
        """The spec of the config's `encoder:` section (or a pooler's): `model` (else the
        section's) and any field in `overrides` win."""
        return derive(cls, enc, model=model or enc.model or "", **overrides)

    def with_updates(self, **changes: Any) -> EncoderSpec:
        """This spec with `changes`, checked as a new spec is."""
        return EncoderSpec(**{**self.model_dump(), "setting": self.setting, **changes})

    @property
    def loading(self) -> dict[str, Any]:
        """The loading settings as transformers' ``from_pretrained`` takes them (the loader,
        ``model_source``, passes them to every read of the model's files)."""
        # always a bool: None would have transformers prompt for it on the terminal
        pin = {"revision": self.revision} if self.revision else {}
        return {"trust_remote_code": bool(self.trust_remote_code), **pin}

    def resolved(self) -> EncoderSpec:
        """Fill unset pooling/prefixes from the preset matching the model name, if any.

        Only the name is read here (no file or hub access). The pooling a model loads with is
        the encoder's to decide (``Encoder.load``): the model's own config comes before its name.
        """
        named = preset(self.model)
        if named is None:
            return self.with_updates(
                query_prefix=self.query_prefix or "", doc_prefix=self.doc_prefix or ""
            )
        pooling, qp, dp = named
        return self.with_updates(
            pooling=pooling if self.pooling == "auto" else self.pooling,
            query_prefix=qp if self.query_prefix is None else self.query_prefix,
            doc_prefix=dp if self.doc_prefix is None else self.doc_prefix,
        )


def model_fingerprint(model: str) -> str:
    """Which weights a vector came from: a local folder's file names, sizes, and the first and
    last MiB of each file (a fine-tuned copy of a model has the same names and sizes, not the
    same bytes); a hub name stands for itself. The model card (README.md, which every
    evaluation of the model appends a row to) and hidden files (a writer's lock) change no
    vector, so they are left out: else each evaluation would make every cached vector stale."""
    if not os.path.isdir(model):
        return f"name:{model}"
    digest = hashlib.blake2b(digest_size=16)
    for root, _, files in sorted(os.walk(model)):
        for name in sorted(files):
            if name == "README.md" or name.startswith("."):
                continue
            path = os.path.join(root, name)
            size = os.path.getsize(path)
            digest.update(f"{os.path.relpath(path, model)}:{size}".encode())
            with open(path, "rb") as f:
                digest.update(f.read(FINGERPRINT_BYTES))
                if size > 2 * FINGERPRINT_BYTES:
                    f.seek(-FINGERPRINT_BYTES, os.SEEK_END)
                    digest.update(f.read())
    return digest.hexdigest()


# Every identity of an encoder derives from its spec here: the vectors it makes (documents and
# queries), the key of a store of them, and the encoder of a training run.


def vector_identity(spec: EncoderSpec) -> dict[str, Any]:
    """Which vectors a spec makes: its settings that change a document's vector and the
    fingerprint of the model's files. Cached vectors (the vector store, the search index) are
    keyed by it, so retraining into the same folder never serves stale vectors."""
    settings = spec.model_dump()
    # a revision only when pinned: identities made before the setting existed stay valid
    pin = {"revision": spec.revision} if spec.revision else {}
    return {
        **{k: settings[k] for k in VECTOR_KEYS},
        **pin,
        "fingerprint": model_fingerprint(spec.model),
    }


def query_identity(spec: EncoderSpec) -> dict[str, Any]:
    """Which query vectors a spec makes: its documents' identity and the query instruction (the
    search index's manifest keeps it, and a reader encodes its queries as it says)."""
    return {**vector_identity(spec), "query_prefix": spec.query_prefix}


# how a spec runs, not what it computes: a reader of stored vectors runs them its own way
OPERATIONAL = ("batch_size", "device", "threads", "token_budget", "trust_remote_code")


def with_identity(identity: dict[str, Any], reader: EncoderSpec, setting: str) -> EncoderSpec:
    """The spec that makes the vectors `identity` (a `query_identity`, as an index's manifest
    keeps it) describes, run as `reader` says: its device, batch size and operational loading
    settings, never the identity's (reading an index runs no model code its reader has not
    allowed). `setting` names where the identity came from."""
    fields = {k: v for k, v in identity.items() if k != "fingerprint"}
    run = {k: getattr(reader, k) for k in OPERATIONAL}
    return EncoderSpec(**fields, **run, setting=setting)


def identity_key(identity: dict[str, Any]) -> str:
    """A short stable key of an identity (a store's folder name, a training run's identity)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def run_identity(spec: EncoderSpec, **context: Any) -> str:
    """What a resumed training run must share with the run it resumes: the encoder it trains
    (the model, its pooling as configured, the weights' dtype and the instructions it is trained
    with) and `context` (the data, the training maths). The loading settings are left out: they
    say how the model loads, not what it computes, so a resume may change them."""
    return identity_key(
        {
            "model": spec.model,
            "pooling": spec.pooling,
            "dtype": spec.dtype,
            "prefixes": [spec.query_prefix, spec.doc_prefix],
            **context,
        }
    )


class RayEncodeOptions(EncoderActors):
    """The actor pool a large corpus is encoded on: the `encoder:` section's actors, by the
    section's names (`EncoderActors`), and how its rows reach them."""

    # rows per map_batches call (the encoder sub-batches them by its spec's batch_size)
    batch_rows: int = Field(256, ge=1)
    # rows per block, at most: small corpora get smaller blocks so every actor works
    rows_per_block: int = Field(2048, ge=1)


@dataclass(frozen=True)
class RetrieverOptions:
    """Every knob of every retriever; each retriever reads the ones it has."""

    # bm25 (Lucene variant)
    k1: float = 1.2
    b: float = 0.75
    # dense / splade: the encoder's settings (its model is the retriever's --model)
    encoder: EncoderSpec | None = None
    search_backend: SearchBackend = "numpy"  # numpy (exact) | faiss
    faiss_index: str = "Flat"  # a faiss index_factory string; Flat is exact
    # large corpora: encoded on a Ray Data actor pool when Ray is up
    ray_min_docs: int = 20_000
    ray: RayEncodeOptions = RayEncodeOptions()
    # hybrid: how its two sides fuse (the `fusion:` section), and the pooled tie-break's seed
    fusion: Fusion = Fusion()
    seed: int = 0

    @classmethod
    def from_config(cls, cfg: Config) -> RetrieverOptions:
        """The retrieval options of the one config tree (`encoder:`, `eval:` and `fusion:`), as
        evaluation, the search index and the dry run build retrievers."""
        return derive(
            cls,
            cfg.eval,
            encoder=EncoderSpec.from_config(cfg.encoder),
            ray=derive(RayEncodeOptions, cfg.encoder),
            fusion=Fusion.from_config(cfg.fusion),
        )

    def encoder_spec(self, model: str) -> EncoderSpec:
        if self.encoder is None:
            return EncoderSpec(model=model)
        return self.encoder.with_updates(model=model)
