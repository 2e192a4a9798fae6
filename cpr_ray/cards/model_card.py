"""The model card (``README.md``) `cpr train` writes into ``OUT/model``, rendered from plain
values: `render_card` of `CardFacts` (which `cpr_ray.train.card_facts` gathers after a run) and
the model's evaluations (which `cpr_ray.cards.evaluations` keeps, in ``evaluations.json`` beside
it).

A Hugging Face / sentence-transformers card: YAML front matter with the fields the Hub and
sentence-transformers read (``base_model``, ``library_name``, ``pipeline_tag``, ``tags``,
``datasets``, ``language``, ``license``, ``model-index``), then Markdown: the model and its
prompts, usage, the training data and where it came from, the training procedure, hardware and
time, the evaluations, the framework versions.

The evaluation table has a row per evaluation, in the order they were recorded: the same
benchmark, subset and protocol evaluated again gets a row of its own. ``model-index`` holds one
entry per (benchmark, subset, variant, protocol) with the latest figures, since the Hub reads it
as the model's current results and two entries for one key would contradict each other.
`with_evaluations` puts a ledger's evaluations into a card already written: the table between
its markers and ``model-index`` are rendered again, everything else (hand edits included) stays.
"""

from __future__ import annotations

import datetime as dt
import json
import posixpath
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from cpr_ray.config import TrainConfig
from cpr_ray.config.search import retriever_label
from cpr_ray.sections import derive

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
FRONT_MATTER = re.compile(r"\A---\n(.*?)\n---\n", re.S)

# -- the facts a card is rendered from -------------------------------------------------------------


@dataclass(frozen=True)
class DataFacts:
    """What the model was trained on: the data, its counts and (an export's) provenance."""

    format: str
    uri: str
    table: str = ""  # an export's table trained on (`cpr-train`)
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
        """The run's settings by their config names (`sections.derive`), and what it measured."""
        data = summary.get("data", {})
        return derive(
            cls,
            tc,
            hard_negatives_max=int(data.get("max_negatives", 0)),
            hard_negatives_mean=float(data.get("mean_negatives", 0.0)),
            betas=(tc.betas[0], tc.betas[1]),
            steps=int(summary["steps"]),
            lora=summary.get("lora"),
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
    mlflow: Mapping[str, str] | None = None  # the MLflow run it was logged in: uri, run_id


# -- evaluations -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Evaluation:
    """One `cpr eval` run as the card records it: a table row and a model-index entry, and an
    entry of the model's ledger (`cpr_ray.cards.evaluations`), which keeps it as data."""

    date: str
    benchmark: str
    subset: str | None
    variant: str | None
    protocol: str  # the retriever, and the reranker or rewriter in front of it
    n_queries: int
    metrics: Mapping[str, tuple[float, float | None, float | None]]  # value, CI low, CI high
    seconds: float | None = None
    id: str = ""  # the ledger's name for this run: it is recorded once, whoever retries
    results: str | None = None  # the results file's URI, where the run wrote one

    @classmethod
    def from_results(cls, results: Mapping[str, Any], uri: str | None = None) -> Evaluation:
        """From a `cpr eval` results dict (`cpr_ray/evaluate/results.py`) written at `uri`."""
        created = str(results.get("created") or "")
        try:
            when = dt.datetime.fromisoformat(created).astimezone(dt.timezone.utc)
        except ValueError:
            when = dt.datetime.now(dt.timezone.utc)
        protocol = retriever_label(dict(results))
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
            id=uuid.uuid4().hex,
            results=uri,
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
    if facts.mlflow:  # `cpr eval` logs the model's evaluations into its training run
        meta["mlflow"] = dict(facts.mlflow)
    if results:
        meta["model-index"] = [{"name": facts.name, "results": [dict(r) for r in results]}]
    return meta


def _yaml(meta: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(meta), sort_keys=False, allow_unicode=True, width=100).rstrip()


def render_card(facts: CardFacts, evaluations: Sequence[Evaluation] = ()) -> str:
    """The card: front matter, then Markdown, with a row per evaluation (in order) and the
    latest figures of each benchmark, subset and protocol in ``model-index``."""
    local = not facts.model_uri.startswith("s3://")
    load_from = facts.model_uri if local else "PATH/TO/A/LOCAL/COPY"
    lines = [
        "---",
        _yaml(front_matter(facts, model_index(evaluations))),
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
        *(
            [f"Logged in MLflow run `{facts.mlflow['run_id']}` at `{facts.mlflow['uri']}`.", ""]
            if facts.mlflow
            else []
        ),
        "## Evaluation",
        "",
        "Each `cpr eval --model` run on this folder adds a dated row; the header's `model-index` "
        "keeps the latest figures of each benchmark, subset and protocol. The interval is the "
        "bootstrap confidence interval of `cpr eval` (95% unless `eval.confidence` says "
        "otherwise).",
        "",
        BEGIN,
        *TABLE_HEADER,
        *(e.row() for e in evaluations),
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
        intro = f"The `{data.table}` split of the CPR dataset export `{data.uri}`" + (
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


# -- a card already written ------------------------------------------------------------------------


def model_index(evaluations: Sequence[Evaluation]) -> list[dict[str, Any]]:
    """``model-index[0].results``: the latest entry of each benchmark, subset, variant and
    protocol, in the order their latest evaluations were recorded."""
    latest: dict[str, dict[str, Any]] = {}
    for e in evaluations:
        entry = e.model_index_result()
        key = json.dumps([entry["task"], entry["dataset"]], sort_keys=True)
        latest.pop(key, None)
        latest[key] = entry
    return list(latest.values())


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


def with_evaluations(text: str, evaluations: Sequence[Evaluation]) -> str:
    """A cpr-ray card with its evaluation table and ``model-index`` rendered from `evaluations`
    (the model's whole ledger); the rest of the card, hand edits included, as it was."""
    parts = split_card(text)
    if parts is None or not is_cpr_card(text):
        raise ValueError("not a cpr-ray model card")
    meta, body = parts
    if evaluations:
        title = re.search(r"^# (.+)$", body, re.M)
        index = meta.get("model-index") or [
            {"name": title.group(1).strip() if title else "cpr-ray retriever"}
        ]
        index[0]["results"] = model_index(evaluations)
        meta["model-index"] = index
    head, rest = body.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    table = "\n".join((BEGIN, *TABLE_HEADER, *(e.row() for e in evaluations), END))
    return f"---\n{_yaml(meta)}\n---\n{head}{table}{tail}"
