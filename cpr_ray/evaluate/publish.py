"""The one publisher of an evaluation's results: `cpr eval` and `jobs/evaluate.py` both call
`publish` and then `show`, so they write the same files and print the same lines.

What a run publishes, in this order: its results JSON at ``eval.out`` (`results.write_results`),
the run in MTEB's result format beside it (`mteb_results`; the CPR benchmarks only), and, when
the model evaluated is a folder whose card cpr-ray wrote, an entry in the model's evaluation
ledger and its row in the card (`cpr_ray.cards.evaluations`). `Published` names what was written.

The experiment tracker attaches in `publish`, after the files are out, from the `Published` it
returns: `cpr_ray.runs.tracking.log_evaluation` logs the metrics and files into MLflow, into the
model's training run when its card names one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.table import Table

from cpr_ray.cards import evaluations as ledger
from cpr_ray.cards.model_card import Evaluation
from cpr_ray.config import Config
from cpr_ray.errors import StorageError
from cpr_ray.evaluate.ir_metrics import METRICS
from cpr_ray.evaluate.mteb_results import write_mteb_results
from cpr_ray.evaluate.results import write_results
from cpr_ray.runs import tracking
from cpr_ray.runs.command_options import console
from cpr_ray.runs.stage_runner import console as warnings
from cpr_ray.storage.store import Storage


@dataclass(frozen=True)
class Published:
    """A run's results and where they went (None: not written)."""

    results: dict[str, Any]
    results_uri: str | None = None
    mteb_uri: str | None = None  # the MTEB task file; its model_meta.json beside it
    card_uri: str | None = None  # the model card; its ledger (evaluations.json) beside it

    def lines(self) -> list[str]:
        """What a run prints after its table: the primary metric in one line, then each file."""
        res, primary = self.results, self.results["primary_metric"]
        block = res[primary]
        run = " ".join(str(p) for p in (res["benchmark"], res.get("subset"), res["retriever"]) if p)
        lines = [
            f"{run}: {primary} {block['value']:.3f} [{block['ci_low']:.3f}, "
            f"{block['ci_high']:.3f}] (random {block['random']:.3f}), {res['n_queries']} queries"
        ]
        for label, uri in (
            ("results", self.results_uri),
            ("MTEB format", self.mteb_uri),
            ("model card", self.card_uri),
        ):
            if uri:
                lines.append(f"{label} → {uri}")
        return lines


def publish(cfg: Config, results: dict[str, Any]) -> Published:
    """Write a run's results where `cfg` says (``eval.out``, ``encoder.model``'s card). A card
    that cannot be updated is a warning: the results themselves are already out."""
    storage = Storage(cfg.storage)
    uri = write_results(storage, cfg.eval.out, results) if cfg.eval.out else None
    mteb = write_mteb_results(storage, uri, results) if uri else None
    try:
        card = ledger.record(storage, cfg.encoder.model, Evaluation.from_results(results, uri))
    except (StorageError, UnicodeDecodeError) as exc:
        warnings.print(f"[yellow]model card not updated[/]: {exc}", soft_wrap=True)
        card = None
    published = Published(results, uri, mteb, card)
    tracking.log_evaluation(cfg, storage, published)
    return published


def show(published: Published) -> None:
    print_results(published.results)
    for line in published.lines():
        console.print(line, soft_wrap=True, highlight=False)


def print_results(res: dict[str, Any]) -> None:
    """The run's metrics as a table: value, confidence interval, random ranking's, the ratio."""
    table = Table(
        title=f"{res['benchmark']} {res.get('subset') or ''} · {res['retriever']} "
        f"{res.get('model') or ''} · {res['n_queries']} queries",
        title_justify="left",
    )
    for col in ("metric", "value", "95% CI", "random", "× random"):
        table.add_column(col, justify="right" if col != "metric" else "left")
    for m in ("accuracy", *METRICS) if "accuracy" in res else METRICS:
        b = res[m]
        vs = "" if b["vs_random"] is None else f"{b['vs_random']:.1f}"
        table.add_row(
            m,
            f"{b['value']:.3f}",
            f"[{b['ci_low']:.3f}, {b['ci_high']:.3f}]",
            f"{b['random']:.3f}",
            vs,
        )
    console.print(table)
    timing = ", ".join(f"{k} {v:.1f}" for k, v in res["timing"].items())
    console.print(f"seconds: {timing}")
    if res.get("input_rejects"):
        console.print(
            f"[yellow]{len(res['input_rejects'])} input record(s) rejected[/] "
            "(listed under input_rejects in the results)"
        )
