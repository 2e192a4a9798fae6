"""The plain dataclasses every encoder and retriever is configured by.

They are the interface between the config tree and this package: the config maps onto them, and
they are what travels to Ray actors, so they hold only plain values and import nothing heavy.

Instructions are plain prefixes. Unset ones come from ``PRESETS`` by model name (E5's
``query: ``/``passage: ``, Qwen3-Embedding's ``Instruct: …\\nQuery: ``, BGE's search prompt), so a
hub name gets the prompt it was trained with; an empty string means "no prefix".
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from cpr_ray.retrieval.fusion import Fusion

if TYPE_CHECKING:
    from cpr_ray.config import Config, EncoderConfig

POOLINGS = ("mean", "cls", "last_token")
# what decides a document's vector (device, batch size and threads do not)
VECTOR_KEYS = ("model", "pooling", "doc_prefix", "max_length", "normalize", "dtype")
FINGERPRINT_BYTES = 1 << 20
DTYPES = ("float32", "float16", "bfloat16")

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


@dataclass(frozen=True)
class EncoderSpec:
    model: str  # local path or hub name
    pooling: str = "auto"  # auto | mean | cls | last_token (ignored by SPLADE)
    query_prefix: str | None = None  # None: from PRESETS, else none
    doc_prefix: str | None = None
    max_length: int = 512
    normalize: bool = True
    batch_size: int = 32  # texts per forward pass, at most
    device: str = "auto"  # auto: CUDA where the process has a GPU, else CPU
    dtype: str = "float32"  # the weights' dtype (bfloat16: GPUs, CPUs with AVX512-BF16/AMX)
    threads: int | None = None  # torch intra-op threads; None leaves torch's default
    # padded tokens per forward pass, at most (texts sorted by token length fill batches up to
    # it, so short texts go in big batches and long ones in small); None: batch_size alone
    token_budget: int | None = None
    # run the model repository's own code (transformers' trust_remote_code): how the model
    # loads, not what it computes, so not among VECTOR_KEYS
    trust_remote_code: bool = False
    # a hub model's revision (branch, tag or commit): which weights, so part of the vector
    # identity when set; a model folder ignores it
    revision: str | None = None
    # the config key that named the model, for the one line a wrong name gives (not part of
    # what the spec is: two specs differing only in it are equal)
    setting: str = field(default="encoder.model", compare=False)

    def __post_init__(self) -> None:
        if self.pooling not in ("auto", *POOLINGS):
            raise ValueError(
                f"unknown pooling {self.pooling!r}; known: auto, {', '.join(POOLINGS)}"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; known: {', '.join(DTYPES)}")
        if self.max_length < 8 or self.batch_size < 1:
            raise ValueError("max_length must be >= 8 and batch_size >= 1")
        if self.token_budget is not None and self.token_budget < 8:
            raise ValueError("token_budget must be >= 8 (or None)")

    @classmethod
    def from_config(
        cls, enc: EncoderConfig, model: str | None = None, **overrides: Any
    ) -> EncoderSpec:
        """The one mapping of the config's `encoder:` section (or a pooler's) onto a spec:
        `model` (else the section's) and any field in `overrides` win."""
        return cls(
            **{
                "model": model or enc.model or "",
                "pooling": enc.pooling,
                "query_prefix": enc.query_prefix,
                "doc_prefix": enc.doc_prefix,
                "max_length": enc.max_length,
                "batch_size": enc.batch_size,
                "device": enc.device,
                "dtype": enc.dtype,
                "trust_remote_code": enc.trust_remote_code,
                "revision": enc.revision,
                **overrides,
            }
        )

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
            return replace(
                self, query_prefix=self.query_prefix or "", doc_prefix=self.doc_prefix or ""
            )
        pooling, qp, dp = named
        return replace(
            self,
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
    settings = asdict(spec)
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


@dataclass(frozen=True)
class RetrieverOptions:
    """Every knob of every retriever; each retriever reads the ones it has."""

    # bm25 (Lucene variant)
    k1: float = 1.2
    b: float = 0.75
    # dense / splade: the encoder's settings (its model is the retriever's --model)
    encoder: EncoderSpec | None = None
    search_backend: str = "numpy"  # numpy (exact) | faiss
    faiss_index: str = "Flat"  # a faiss index_factory string; Flat is exact
    # large corpora: encoded on a Ray Data actor pool when Ray is up
    ray_min_docs: int = 20_000
    ray_max_actors: int = 2
    ray_batch_size: int = 256
    ray_num_cpus: float = 1.0
    ray_num_gpus: float = 0.0
    ray_resources: dict[str, float] = field(default_factory=dict)
    # hybrid: how its two sides fuse (the `fusion:` section), and the pooled tie-break's seed
    fusion: Fusion = Fusion()
    seed: int = 0

    def __post_init__(self) -> None:
        if self.search_backend not in ("numpy", "faiss"):
            raise ValueError(f"unknown search_backend {self.search_backend!r}; use numpy or faiss")

    @classmethod
    def from_config(cls, cfg: Config) -> RetrieverOptions:
        """The retrieval options of the one config tree (`encoder:` and `eval:`), as evaluation,
        the search index and the dry run build retrievers."""
        enc, ev = cfg.encoder, cfg.eval
        return cls(
            encoder=EncoderSpec.from_config(enc),
            search_backend=ev.search_backend,
            faiss_index=ev.faiss_index,
            ray_min_docs=ev.ray_min_docs,
            ray_max_actors=enc.actors,
            ray_num_cpus=enc.cpus_per_actor,
            ray_num_gpus=enc.gpus_per_actor,
            ray_resources=dict(enc.resources_per_actor),
            fusion=Fusion.from_config(cfg.fusion),
            seed=ev.seed,
        )

    def encoder_spec(self, model: str) -> EncoderSpec:
        return replace(self.encoder, model=model) if self.encoder else EncoderSpec(model)
