"""The model card (``README.md``) `cpr train` writes into ``OUT/model`` and `cpr eval --model`
adds its results to.

A Hugging Face / sentence-transformers card: YAML front matter with the fields the Hub and
sentence-transformers read (``base_model``, ``library_name``, ``pipeline_tag``, ``tags``,
``datasets``, ``language``, ``license``, ``model-index``), then Markdown: the model and its
prompts, usage, the training data and where it came from, the training procedure, hardware and
time, the evaluations, the framework versions. `render_card` is a pure function of `CardFacts`
(plain values); `training_facts` gathers them after a run, from the config, the run's summary,
the saved model's sentence-transformers files and, for a CPR export, its ``stats.json`` and card.

Evaluations are appended, never overwritten. Each `cpr eval --model FOLDER` on a folder holding
a cpr-ray card (its ``cpr-ray`` tag and the evaluation table's markers) adds one dated row to the
card's table, which is the history: the same benchmark, subset and protocol evaluated again gets
a row of its own, the earlier one stays. ``model-index`` holds one entry per (benchmark, subset,
variant, protocol) with the latest figures, since the Hub reads it as the model's current
results and two entries for one key would contradict each other; an entry for another key is
never touched. A card rendered again (a rerun that finishes a run whose summary was not written)
keeps the table's rows and the ``model-index`` entries. A folder without a cpr-ray card (a hub
name, another library's model) is left untouched.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import yaml

from cpr_ray.config import Config, TrainConfig
from cpr_ray.dataset.format import CARD, STATS, TRAIN_TABLE
from cpr_ray.errors import StorageError
from cpr_ray.stage import code_version, console
from cpr_ray.storage import Storage, join

TAG = "cpr-ray"
LOSS = "InfoNCE"
BEGIN = "<!-- cpr-ray evaluations: `cpr eval --model` appends a row above the end marker -->"
END = "<!-- end of cpr-ray evaluations -->"
TABLE_HEADER = (
    "| date (UTC) | benchmark | subset | protocol | queries | nDCG@10 [CI] | Recall@1 | "
    "Recall@10 | MRR@10 | seconds |",
    "|---|---|---|---|---:|---:|---:|---:|---:|---:|",
)
TABLE_METRICS = ("recall_at_1", "recall_at_10", "mrr_at_10")
METRIC_NAMES = {
    "ndcg_at_10": "nDCG@10",
    "recall_at_1": "Recall@1",
    "recall_at_5": "Recall@5",
    "recall_at_10": "Recall@10",
    "mrr_at_10": "MRR@10",
    "accuracy": "Accuracy",
}
BENCHMARK_NAMES = {
    "cpr": "CPR-eval",
    "cpr-full": "CPR-eval (full corpus)",
    "beir": "BEIR",
    "analobench": "AnaloBench",
    "bright": "BRIGHT",
}
# the public formats are English; a triplets file may be anything
FORMAT_LANGUAGE = {"cpr": "en", "msmarco": "en", "reasonir": "en", "specter": "en"}
EXPORT_RUN_ID = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]{6}$")  # the export stage's run id
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
FRONT_MATTER = re.compile(r"\A---\n(.*?)\n---\n", re.S)
VERSIONED = ("sentence-transformers", "transformers", "torch", "ray")

# -- the facts a card is rendered from -------------------------------------------------------------


@dataclass(frozen=True)
class DataFacts:
    """What the model was trained on: the data, its counts and (an export's) provenance."""

    format: str
    uri: str
    export_id: str | None = None  # the export stage's run id, where the folder is named by it
    built: str | None = None  # when and by which cpr-ray the export was built (its card)
    release: str | None = None  # the corpus releases the export was built from
    counts: tuple[tuple[str, float], ...] = ()  # (what, how many), in order
    provenance: tuple[tuple[str, str], ...] = ()  # (what, where from)

    @property
    def label(self) -> str:
        if self.format == "cpr":
            return "CPR-train"
        return posixpath.basename(self.uri.rstrip("/")) or self.uri


@dataclass(frozen=True)
class ProcedureFacts:
    """The loss and the optimisation as run."""

    temperature: float
    batch_size: int
    workers: int
    hard_negatives_max: int
    hard_negatives_mean: float
    chunk_size: int | None
    lr: float
    warmup_steps: int
    min_lr_ratio: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    max_grad_norm: float | None
    epochs: int
    steps: int
    seed: int
    strategy: str
    lora: Mapping[str, Any] | None = None
    cw_weighting: bool = False
    gradient_checkpointing: bool = False
    bf16: bool = False  # bf16 autocast (GPU workers only)
    final: Mapping[str, float] = field(default_factory=dict)  # the last step's loss, accuracy

    @classmethod
    def from_run(cls, tc: TrainConfig, summary: Mapping[str, Any], *, bf16: bool) -> ProcedureFacts:
        data = summary.get("data", {})
        return cls(
            temperature=tc.temperature,
            batch_size=tc.batch_size,
            workers=tc.workers,
            hard_negatives_max=int(data.get("max_negatives", 0)),
            hard_negatives_mean=float(data.get("mean_negatives", 0.0)),
            chunk_size=tc.chunk_size,
            lr=tc.lr,
            warmup_steps=tc.warmup_steps,
            min_lr_ratio=tc.min_lr_ratio,
            betas=tuple(tc.betas),
            eps=tc.eps,
            weight_decay=tc.weight_decay,
            max_grad_norm=tc.max_grad_norm,
            epochs=tc.epochs,
            steps=int(summary["steps"]),
            seed=tc.seed,
            strategy=tc.strategy,
            lora=summary.get("lora"),
            cw_weighting=tc.cw_weighting,
            gradient_checkpointing=tc.gradient_checkpointing,
            bf16=bf16,
            final=dict(summary.get("final") or {}),
        )


@dataclass(frozen=True)
class HardwareFacts:
    workers: int
    cpus_per_worker: float
    gpus_per_worker: int
    seconds: float
    peak_memory_mb: tuple[float, ...] = ()
    device: str | None = None
    resources: Mapping[str, float] = field(default_factory=dict)  # custom Ray resources


@dataclass(frozen=True)
class CardFacts:
    """Everything a training card says, as plain values."""

    name: str
    model_uri: str
    base_model: str
    base_model_id: str | None  # the base model's hub id, where it is one (front matter)
    pooling: str
    max_length: int
    dim: int | None
    similarity: str
    query_prompt: str
    document_prompt: str
    data: DataFacts
    procedure: ProcedureFacts
    hardware: HardwareFacts
    versions: tuple[tuple[str, str], ...]
    created: str
    language: str | None = None
    license: str | None = None


# -- evaluations -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Evaluation:
    """One `cpr eval` run as the card records it: a table row and a model-index entry."""

    date: str
    benchmark: str
    subset: str | None
    variant: str | None
    protocol: str  # the retriever, and the reranker or rewriter in front of it
    n_queries: int
    metrics: Mapping[str, tuple[float, float | None, float | None]]  # value, CI low, CI high
    seconds: float | None = None

    @classmethod
    def from_results(cls, results: Mapping[str, Any]) -> Evaluation:
        """From a `cpr eval` results dict (`cpr_ray/evaluate/results.py`)."""
        created = str(results.get("created") or "")
        try:
            when = dt.datetime.fromisoformat(created).astimezone(dt.timezone.utc)
        except ValueError:
            when = dt.datetime.now(dt.timezone.utc)
        protocol = str(results["retriever"])
        if results.get("rewrite"):
            protocol = f"rewrite {results['rewrite']} + {protocol}"
        if results.get("rerank"):
            protocol += f" + rerank {results['rerank']}"
        subset = results.get("subset")
        if not subset and results.get("benchmark") == "beir" and results.get("data"):
            subset = posixpath.basename(str(results["data"]).rstrip("/"))  # scifact, nfcorpus
        metrics = {
            m: (float(b["value"]), b.get("ci_low"), b.get("ci_high"))
            for m in METRIC_NAMES
            if isinstance(b := results.get(m), Mapping) and b.get("value") is not None
        }
        variant = results.get("variant")
        return cls(
            date=when.strftime("%Y-%m-%d %H:%M"),
            benchmark=str(results["benchmark"]),
            subset=subset or None,
            variant=variant if variant not in (None, "full") else None,
            protocol=protocol,
            n_queries=int(results["n_queries"]),
            metrics=metrics,
            seconds=(results.get("timing") or {}).get("total_s"),
        )

    def row(self) -> str:
        """Its line in the card's evaluation table."""

        def value(m: str) -> str:
            return f"{self.metrics[m][0]:.4f}" if m in self.metrics else "–"

        ndcg = value("ndcg_at_10")
        low, high = self.metrics.get("ndcg_at_10", (0.0, None, None))[1:]
        if low is not None and high is not None:
            ndcg += f" [{low:.3f}, {high:.3f}]"
        subset = (self.subset or "–") + (f" ({self.variant})" if self.variant else "")
        cells = [
            self.date,
            BENCHMARK_NAMES.get(self.benchmark, self.benchmark),
            subset,
            self.protocol,
            f"{self.n_queries:,}",
            ndcg,
            *(value(m) for m in TABLE_METRICS),
            "–" if self.seconds is None else f"{self.seconds:.1f}",
        ]
        return "| " + " | ".join(_cell(c) for c in cells) + " |"

    def model_index_result(self) -> dict[str, Any]:
        """Its entry under ``model-index[0].results`` (the Hub's schema)."""
        name = BENCHMARK_NAMES.get(self.benchmark, self.benchmark)
        dataset: dict[str, Any] = {
            "name": f"{name} {self.subset}" if self.subset else name,
            "type": self.benchmark,
            "split": "test",
        }
        if self.subset:
            dataset["config"] = self.subset
        if self.variant:
            dataset["args"] = {"variant": self.variant}
        return {
            "task": {"type": "retrieval", "name": f"Retrieval ({self.protocol})"},
            "dataset": dataset,
            "metrics": [
                {"type": m, "value": round(v, 4), "name": METRIC_NAMES[m]}
                for m, (v, _, _) in self.metrics.items()
            ],
        }


# -- rendering (pure) ------------------------------------------------------------------------------


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _prompt(text: str) -> str:
    """A prompt shown exactly (quotes, escapes), or that there is none."""
    return "none" if not text else "`" + json.dumps(text).replace("`", "'") + "`"


def _number(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:,.3f}".rstrip("0")


def _table(rows: Sequence[tuple[str, str]], header: tuple[str, str] = ("", "")) -> list[str]:
    return [
        f"| {header[0]} | {header[1]} |",
        "|---|---|",
        *(f"| {_cell(k)} | {_cell(v)} |" for k, v in rows),
    ]


def front_matter(facts: CardFacts, results: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The card's YAML header, in the fields and order sentence-transformers writes."""
    meta: dict[str, Any] = {}
    if facts.base_model_id:
        meta["base_model"] = facts.base_model_id
    meta["library_name"] = "sentence-transformers"
    meta["pipeline_tag"] = "sentence-similarity"
    meta["tags"] = [
        "sentence-transformers",
        "feature-extraction",
        "sentence-similarity",
        TAG,
        LOSS.lower(),
    ]
    if facts.data.export_id:
        meta["datasets"] = [facts.data.export_id]
    if facts.language:
        meta["language"] = [facts.language]
    if facts.license:
        meta["license"] = facts.license
    if results:
        meta["model-index"] = [{"name": facts.name, "results": [dict(r) for r in results]}]
    return meta


def _yaml(meta: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(meta), sort_keys=False, allow_unicode=True, width=100).rstrip()


def render_card(
    facts: CardFacts,
    rows: Sequence[str] = (),
    results: Sequence[Mapping[str, Any]] = (),
) -> str:
    """The card: front matter, then Markdown. `rows` are evaluation table lines
    (`Evaluation.row`), `results` model-index entries (`Evaluation.model_index_result`)."""
    local = not facts.model_uri.startswith("s3://")
    load_from = facts.model_uri if local else "PATH/TO/A/LOCAL/COPY"
    lines = [
        "---",
        _yaml(front_matter(facts, results)),
        "---",
        "",
        f"# {facts.name}",
        "",
        f"A dense retriever fine-tuned by cpr-ray from `{facts.base_model}` with an {LOSS} "
        f"contrastive loss on {facts.data.label}. It maps a text to a "
        + (f"{facts.dim}-dimensional " if facts.dim else "")
        + f"vector; queries and documents are compared by {facts.similarity} similarity. "
        f"Trained {facts.created}.",
        "",
        *_model_section(facts),
        "",
        "## Usage",
        "",
        "```python",
        "from sentence_transformers import SentenceTransformer",
        "",
        f"model = SentenceTransformer({json.dumps(load_from)})",
        'queries = model.encode_query(["How to reduce the drag of a ship hull?"])',
        "documents = model.encode_document(",
        '    ["Shark skin riblets. Riblets on shark skin cut turbulent skin friction."]',
        ")",
        "print(model.similarity(queries, documents))",
        "```",
        "",
        "Evaluate it with cpr-ray (each run adds a row to the evaluation table below):",
        "",
        "```",
        f"cpr eval --benchmark cpr --data EXPORT --retriever dense --model {facts.model_uri}",
        "```",
        "",
        *_data_section(facts.data),
        "",
        *_procedure_section(facts.procedure),
        "",
        *_hardware_section(facts.hardware),
        "",
        "## Evaluation",
        "",
        "Each `cpr eval --model` run on this folder adds a dated row; the header's `model-index` "
        "keeps the latest figures of each benchmark, subset and protocol. The interval is the "
        "bootstrap confidence interval of `cpr eval` (95% unless `eval.confidence` says "
        "otherwise).",
        "",
        BEGIN,
        *TABLE_HEADER,
        *rows,
        END,
        "",
        "## Framework versions",
        "",
        *(f"- {name}: {version}" for name, version in facts.versions),
        "",
    ]
    return "\n".join(lines)


def _model_section(facts: CardFacts) -> list[str]:
    return [
        "## Model description",
        "",
        *_table(
            [
                ("Base model", f"`{facts.base_model}`"),
                ("Pooling", facts.pooling),
                ("Maximum length", f"{facts.max_length:,} tokens"),
                ("Output dimension", str(facts.dim) if facts.dim else "–"),
                ("Similarity", facts.similarity),
                ("Query prompt", _prompt(facts.query_prompt)),
                ("Document prompt", _prompt(facts.document_prompt)),
            ]
        ),
        "",
        "The prompts are saved in `config_sentence_transformers.json` (`prompts.query`, "
        "`prompts.document`): `model.encode_query(texts)` puts the query prompt before each "
        "text and `model.encode_document(texts)` the document prompt, as training did; "
        '`model.encode` adds none unless given `prompt_name="query"` or `"document"`. '
        "`cpr eval --retriever dense --model` reads them from the same file.",
    ]


def _data_section(data: DataFacts) -> list[str]:
    if data.format == "cpr":
        intro = f"The `{TRAIN_TABLE}` split of the CPR dataset export `{data.uri}`" + (
            f" (export `{data.export_id}`)" if data.export_id else ""
        )
        intro += f", built {data.built}." if data.built else "."
    else:
        intro = f"`{data.label}` (format `{data.format}`), at `{data.uri}`."
    lines = ["## Training data", "", intro]
    if data.release:
        lines += ["", f"Corpus releases: {data.release}."]
    if data.counts:
        lines += ["", *_table([(k, _number(v)) for k, v in data.counts], ("", "count"))]
    if data.provenance:
        lines += ["", "Provenance (from the export's card and `stats.json`):", ""]
        lines += [f"- {k}: {v}" for k, v in data.provenance]
    return lines


def _procedure_section(p: ProcedureFacts) -> list[str]:
    per_worker = p.batch_size // max(1, p.workers)
    negatives = "in-batch (every other document of the global batch)"
    if p.workers > 1:
        negatives += f", gathered across the {p.workers} workers with their gradients"
    if p.hard_negatives_max:
        negatives += (
            f", plus up to {p.hard_negatives_max} hard negative(s) per query "
            f"(mean {p.hard_negatives_mean:g})"
        )
    else:
        negatives += "; no hard negatives"
    rows = [
        ("loss", f"{LOSS}, temperature {p.temperature:g} (scale {1 / p.temperature:g})"),
        ("negatives", negatives),
        (
            "gradient cache",
            f"chunks of {p.chunk_size} texts per forward (used when a worker's batch is larger)"
            if p.chunk_size
            else "off (one forward per step)",
        ),
        ("batch", f"{p.batch_size} queries per step over all workers ({per_worker} a worker)"),
        (
            "optimiser",
            f"AdamW, lr {p.lr:g}, betas ({p.betas[0]:g}, {p.betas[1]:g}), eps {p.eps:g}, "
            f"weight decay {p.weight_decay:g}, "
            + (f"gradient norm clipped to {p.max_grad_norm:g}" if p.max_grad_norm else "no clip"),
        ),
        (
            "schedule",
            f"{p.warmup_steps} warm-up steps, then cosine to {p.min_lr_ratio:g} × lr",
        ),
        ("epochs, steps", f"{p.epochs} epoch(s), {p.steps} optimiser step(s)"),
        ("content-word weighting", "on" if p.cw_weighting else "off"),
        ("strategy", p.strategy),
        (
            "LoRA",
            ", ".join(f"{k} {v}" for k, v in p.lora.items()) + " (merged into the weights)"
            if p.lora
            else "off (every weight trained)",
        ),
        ("precision", "bf16 autocast" if p.bf16 else "float32"),
        ("gradient checkpointing", "on" if p.gradient_checkpointing else "off"),
        ("seed", str(p.seed)),
    ]
    if p.final:
        names = {"accuracy": "in-batch accuracy"}
        last = ", ".join(f"{names.get(k, k)} {v:.4g}" for k, v in p.final.items())
        rows.append(("last step", last))
    return ["## Training procedure", "", *_table(rows, ("setting", "value"))]


def _hardware_section(h: HardwareFacts) -> list[str]:
    per_worker = f"{h.cpus_per_worker:g} CPU(s)" + (
        f", {h.gpus_per_worker} GPU" if h.gpus_per_worker else ""
    )
    per_worker += "".join(f", {v:g} {k}" for k, v in h.resources.items())
    minutes, seconds = divmod(round(h.seconds), 60)
    rows = [
        ("workers", str(h.workers)),
        ("per worker", per_worker),
        ("device", h.device or "–"),
        (
            "wall time of the run",
            f"{h.seconds:,.1f} s ({minutes // 60}h {minutes % 60:02d}m {seconds:02d}s)",
        ),
        (
            "peak memory per worker",
            ", ".join(f"{m:,.0f} MiB" for m in h.peak_memory_mb) or "–",
        ),
    ]
    return ["## Hardware and time", "", *_table(rows)]


# -- reading and appending (pure) ------------------------------------------------------------------


def split_card(text: str) -> tuple[dict[str, Any], str] | None:
    """(front matter, body) of a card; None when it has no YAML header that parses."""
    match = FRONT_MATTER.match(text)
    if match is None:
        return None
    try:
        meta = yaml.safe_load(match.group(1))
    except yaml.YAMLError:
        return None
    return (meta, text[match.end() :]) if isinstance(meta, dict) else None


def is_cpr_card(text: str) -> bool:
    """A card cpr-ray wrote: its tag in the header, and the evaluation table's markers."""
    parts = split_card(text)
    return (
        parts is not None
        and TAG in (parts[0].get("tags") or [])
        and BEGIN in parts[1]
        and END in parts[1]
    )


def recorded(text: str) -> tuple[list[str], list[dict[str, Any]]]:
    """The evaluation table's rows and the model-index entries of a cpr-ray card."""
    parts = split_card(text)
    if parts is None or not is_cpr_card(text):
        return [], []
    meta, body = parts
    table = body.split(BEGIN, 1)[1].split(END, 1)[0].strip().splitlines()
    rows = [line for line in table[len(TABLE_HEADER) :] if line.startswith("|")]
    index = meta.get("model-index") or [{}]
    return rows, list(index[0].get("results") or [])


def _same_key(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return a.get("task") == b.get("task") and a.get("dataset") == b.get("dataset")


def add_evaluation(text: str, evaluation: Evaluation, *, name: str | None = None) -> str:
    """The card with `evaluation` appended: a new table row, and its model-index entry (which
    replaces the entry of the same benchmark, subset, variant and protocol, if any). Everything
    else in the card, hand edits included, stays as it was."""
    parts = split_card(text)
    if parts is None or not is_cpr_card(text):
        raise ValueError("not a cpr-ray model card")
    meta, body = parts
    new = evaluation.model_index_result()
    title = re.search(r"^# (.+)$", body, re.M)
    name = name or (title.group(1).strip() if title else "cpr-ray retriever")
    index = meta.get("model-index") or [{"name": name, "results": []}]
    results = [r for r in index[0].get("results") or [] if not _same_key(r, new)]
    index[0]["results"] = [*results, new]
    meta["model-index"] = index
    head, tail = body.rsplit(END, 1)
    body = head.rstrip("\n") + "\n" + evaluation.row() + "\n" + END + tail
    return f"---\n{_yaml(meta)}\n---\n{body}"


# -- gathering the facts and writing ---------------------------------------------------------------


def device_name(device: Any) -> str:
    """A torch device in words: the GPU's name, or the CPU's architecture."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.machine() or 'unknown'})"


def _read_json(storage: Storage, uri: str) -> dict[str, Any]:
    try:
        return storage.read_json(uri) if storage.is_file(uri) else {}
    except (OSError, ValueError):
        return {}


def _read_text(storage: Storage, uri: str) -> str | None:
    try:
        return storage.read_text(uri) if storage.is_file(uri) else None
    except (OSError, ValueError):
        return None


def hub_id(model: str) -> str | None:
    """`model` when it names a hub repository rather than a folder or a storage URI."""
    if "://" in model or model.startswith((".", "/", "~")) or os.path.exists(model):
        return None
    return model if HUB_ID.match(model) else None


def _versions() -> tuple[tuple[str, str], ...]:
    found = [("cpr-ray", code_version()), ("python", platform.python_version())]
    for name in VERSIONED:
        try:
            found.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            continue
    return tuple(found)


def export_facts(storage: Storage, uri: str) -> DataFacts:
    """What the card says about a CPR export: its id, build, releases, counts and provenance,
    from its ``stats.json`` and its own card (either may be absent: a hand-made export)."""
    stats = _read_json(storage, join(uri, STATS))
    card = _read_text(storage, join(uri, CARD)) or ""
    name = posixpath.basename(uri.rstrip("/"))
    built = re.search(r"^Built (.+?) by cpr-ray (\S+?)\.?$", card, re.M)
    prov = stats.get("provenance") or {}
    release = "; ".join(
        x
        for x in (
            f"Semantic Scholar {prov['s2_releases']}" if prov.get("s2_releases") else "",
            f"OpenAlex topics {prov['openalex_snapshot']}" if prov.get("openalex_snapshot") else "",
        )
        if x
    )
    counts: list[tuple[str, float]] = []
    for split, s in (stats.get("splits") or {}).items():
        for key in ("queries", "positives", "negatives", "base_papers"):
            if key in s:
                counts.append((f"export: {split} {key.replace('_', ' ')}", s[key]))
    if "papers" in (stats.get("corpus") or {}):
        counts.append(("export: corpus papers", stats["corpus"]["papers"]))
    provenance = [
        (k, v)
        for k, v in (
            ("Semantic Scholar input", f"`{prov['s2']}`" if prov.get("s2") else ""),
            ("OpenAlex input", f"`{prov['openalex']}`" if prov.get("openalex") else ""),
            ("build config hash", f"`{prov['config_hash']}`" if prov.get("config_hash") else ""),
            ("built by", f"cpr-ray {prov['code_version']}" if prov.get("code_version") else ""),
            (
                "abstracts carried under",
                ", ".join(prov.get("open_licenses") or []),
            ),
        )
        if v
    ]
    for stage, s in (prov.get("stages") or {}).items():
        if s.get("model"):
            provenance.append(
                (
                    f"stage {stage}",
                    f"run {s.get('run_id')}, model {s['model']}"
                    + (f", prompt {s['prompt_version']}" if s.get("prompt_version") else ""),
                )
            )
    return DataFacts(
        format="cpr",
        uri=uri,
        export_id=name if EXPORT_RUN_ID.match(name) else None,
        built=f"{built.group(1)} by cpr-ray {built.group(2)}" if built else None,
        release=release or None,
        counts=tuple(counts),
        provenance=tuple(provenance),
    )


def data_facts(
    storage: Storage, tc: TrainConfig, stats: Mapping[str, Any], examples: str
) -> DataFacts:
    """The training data: the run's counts (pairs, distinct queries and positives, rows read,
    dropped by reason) and, for an export, what its card and stats say."""
    import pyarrow.compute as pc

    uri = storage.resolve(str(stats.get("data") or tc.data)).uri
    base = export_facts(storage, uri) if tc.format == "cpr" else DataFacts(tc.format, uri)
    counts: list[tuple[str, float]] = [
        ("pairs trained on (query, positive)", stats.get("examples", 0))
    ]
    try:
        table = storage.read_parquet(examples, columns=["query", "positive_key"])
        counts += [
            ("distinct queries", pc.count_distinct(table.column("query")).as_py()),
            ("distinct positives", pc.count_distinct(table.column("positive_key")).as_py()),
        ]
    except (OSError, StorageError):
        pass
    counts += [("rows read", stats.get("rows_read", 0))]
    counts += [
        (f"dropped: {k.removeprefix('dropped_').replace('_', ' ')}", v)
        for k, v in stats.items()
        if k.startswith("dropped_") and v
    ]
    return DataFacts(
        format=base.format,
        uri=uri,
        export_id=base.export_id,
        built=base.built,
        release=base.release,
        counts=(*counts, *base.counts),
        provenance=base.provenance,
    )


def training_facts(
    storage: Storage,
    cfg: Config,
    summary: Mapping[str, Any],
    *,
    examples: str,
    device: str | None = None,
) -> CardFacts:
    """The facts of a finished run: the config, its summary (`run_train`'s), the saved model's
    sentence-transformers files, the examples it trained on (`examples`: their Parquet URI)."""
    from cpr_ray.retrieval.encoder import ST_POOLING_FLAGS, ST_POOLINGS

    tc, model_uri = cfg.train, str(summary["model"])
    st = _read_json(storage, join(model_uri, "config_sentence_transformers.json"))
    bert = _read_json(storage, join(model_uri, "sentence_bert_config.json"))
    pooling_cfg = _read_json(storage, join(model_uri, "1_Pooling", "config.json"))
    modes = [ST_POOLINGS.get(m, m) for f, m in ST_POOLING_FLAGS.items() if pooling_cfg.get(f)]
    prompts = st.get("prompts") or {}
    base = str(summary["base_model"])
    base_card = _read_text(storage, join(base, CARD)) if os.path.isdir(base) else None
    base_meta = (split_card(base_card) or ({}, ""))[0] if base_card else {}
    data = data_facts(storage, tc, summary.get("data") or {}, examples)
    peaks = summary.get("peak_memory_mb_per_worker") or []
    return CardFacts(
        name=f"{posixpath.basename(base.rstrip('/'))} fine-tuned on {data.label}",
        model_uri=model_uri,
        base_model=base,
        base_model_id=hub_id(base),
        pooling=", ".join(modes) or cfg.encoder.pooling,
        max_length=int(bert.get("max_seq_length") or tc.max_length),
        dim=pooling_cfg.get("word_embedding_dimension"),
        similarity=st.get("similarity_fn_name") or "cosine",
        query_prompt=prompts.get("query", summary.get("query_prefix", "")),
        document_prompt=prompts.get("document", summary.get("doc_prefix", "")),
        data=data,
        procedure=ProcedureFacts.from_run(tc, summary, bf16=tc.use_gpu and tc.bf16),
        hardware=HardwareFacts(
            workers=int(summary.get("workers", tc.workers)),
            cpus_per_worker=float(summary.get("cpus_per_worker") or tc.cpus_per_worker or 1),
            gpus_per_worker=1 if tc.use_gpu else 0,
            seconds=float(summary.get("seconds", 0.0)),
            peak_memory_mb=tuple(float(p) for p in peaks if p is not None),
            device=device,
            resources=dict(tc.resources_per_worker),
        ),
        versions=_versions(),
        created=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        language=FORMAT_LANGUAGE.get(tc.format),
        license=base_meta.get("license") if isinstance(base_meta.get("license"), str) else None,
    )


def write_training_card(
    storage: Storage,
    cfg: Config,
    summary: Mapping[str, Any],
    *,
    examples: str,
    device: str | None = None,
) -> str:
    """Write ``README.md`` into the run's model folder (local or s3://); returns its URI. A card
    already there from an earlier finish of this run keeps its evaluations."""
    facts = training_facts(storage, cfg, summary, examples=examples, device=device)
    uri = join(facts.model_uri, CARD)
    # conditional, as an evaluation's append is: one landing meanwhile is kept, not overwritten
    storage.update_text(uri, lambda text: render_card(facts, *recorded(text or "")))
    return uri


def _model_folder(model: str | None) -> bool:
    if not model:
        return False
    if model.startswith("s3://"):
        return True
    return os.path.isdir(model.removeprefix("file://"))


def record_evaluation(
    storage: Storage, model: str | None, results: Mapping[str, Any]
) -> str | None:
    """Append a `cpr eval` run's results to the card of the model folder `model` (local or
    s3://) when cpr-ray wrote that card; the card's URI, or None where nothing was written (no
    folder, no card, another library's card). Storage that fails is a warning: the results
    themselves are already out.

    Evaluations of one model run at once (a job array of benchmarks), so the append is a
    conditional write (`Storage.update_text`): a run that lost the race adds its row to the card
    the winner wrote, and every row stays."""
    if not _model_folder(model):
        return None
    assert model is not None
    uri = join(model, CARD)
    evaluation = Evaluation.from_results(results)
    retry = False

    def append(text: str | None) -> str | None:
        nonlocal retry
        if text is None or not is_cpr_card(text):
            return None
        # our lost write may have landed after all (S3 refusing the repeat of a request whose
        # reply was lost): its row is there, and a second would record this run twice
        if retry and evaluation.row() in recorded(text)[0]:
            return text
        retry = True
        return add_evaluation(text, evaluation)

    try:
        if storage.update_text(uri, append) is None:
            return None
    except (StorageError, UnicodeDecodeError) as exc:
        console.print(f"[yellow]model card not updated[/]: {exc}", soft_wrap=True)
        return None
    return uri
