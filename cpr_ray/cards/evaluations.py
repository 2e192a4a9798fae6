"""The model's evaluation ledger: ``evaluations.json`` beside its card, every `cpr eval --model`
run on the folder as data, in the order they were recorded. The card's table and ``model-index``
are rendered from it (`cpr_ray.cards.model_card.with_evaluations`), never read back from Markdown.

``{"format": "cpr-ray-evaluations-1", "evaluations": [ENTRY, …]}``, an entry being an
`Evaluation`'s fields: ``id``, ``date`` (UTC, minutes), ``benchmark``, ``subset``, ``variant``,
``protocol``, ``n_queries``, ``metrics`` (``{name: {value, ci_low, ci_high}}``), ``seconds``
and ``results`` (the results file's URI, or null).

Evaluations of one model run at once (a job array of benchmarks), so each step is a conditional
read-modify-write (`Storage.update_text`): the entry goes into the ledger, then the card is
rendered from the ledger as it is then. A run that lost either race applies its change to the
winner's file, so every entry stays and the last card written shows them all (each card write
reads the ledger after the card version it replaces). An entry is added once, by its id, even
when a write that landed was reported lost.

A card written before the ledger existed holds its evaluations in Markdown only: `migrate` reads
them once, when the first evaluation is recorded without a ledger (`evaluations`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Sequence
from typing import Any

from cpr_ray.cards.model_card import (
    BEGIN,
    BENCHMARK_NAMES,
    END,
    METRIC_NAMES,
    TABLE_HEADER,
    TABLE_METRICS,
    Evaluation,
    is_cpr_card,
    split_card,
    with_evaluations,
)
from cpr_ray.errors import StorageError
from cpr_ray.storage.store import Storage, join

LEDGER = "evaluations.json"
CARD = "README.md"  # the model card, as sentence-transformers and the Hub name it
FORMAT = "cpr-ray-evaluations-1"
CELL = re.compile(r"(?<!\\)\|")  # a table's cell boundary: a pipe not escaped
SUBSET = re.compile(r"^(.*?)(?: \((.+)\))?$")  # "scifact", "– (no-e5)"


def to_json(evaluations: Sequence[Evaluation]) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "evaluations": [
            {
                "id": e.id,
                "date": e.date,
                "benchmark": e.benchmark,
                "subset": e.subset,
                "variant": e.variant,
                "protocol": e.protocol,
                "n_queries": e.n_queries,
                "metrics": {
                    m: {"value": v, "ci_low": lo, "ci_high": hi}
                    for m, (v, lo, hi) in e.metrics.items()
                },
                "seconds": e.seconds,
                "results": e.results,
            }
            for e in evaluations
        ],
    }


def from_json(text: str, uri: str) -> list[Evaluation]:
    """The ledger's evaluations; a StorageError naming the file when it is not one."""
    try:
        data = json.loads(text)
        if data.get("format") != FORMAT:
            raise ValueError(data.get("format"))
        return [
            Evaluation(
                **{
                    **e,
                    "metrics": {
                        m: (b["value"], b.get("ci_low"), b.get("ci_high"))
                        for m, b in e["metrics"].items()
                    },
                }
            )
            for e in data["evaluations"]
        ]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise StorageError(
            f"{uri}: not a cpr-ray evaluation ledger (format {FORMAT!r}); move it away and "
            "the card's table becomes the ledger again"
        ) from None


def _number(cell: str) -> float | None:
    return None if cell == "–" else float(cell.replace(",", ""))


def migrate(card: str) -> list[Evaluation]:
    """The evaluations a card written before the ledger holds: one per row of its table, with
    the figures the row shows; the latest row of each benchmark, subset and protocol also gets
    the figures of its ``model-index`` entry (Recall@5, accuracy), so that the card rendered
    from the ledger is the card that was there. A ``model-index`` entry without a row (a hand
    edit) is not carried over."""
    parts = split_card(card)
    if parts is None or not is_cpr_card(card):
        return []
    meta, body = parts
    table = body.split(BEGIN, 1)[1].split(END, 1)[0].strip().splitlines()[len(TABLE_HEADER) :]
    benchmarks = {name: key for key, name in BENCHMARK_NAMES.items()}
    found: list[Evaluation] = []
    for i, line in enumerate(row for row in table if row.startswith("|")):
        cells = [c.strip().replace("\\|", "|") for c in CELL.split(line.strip()[1:-1])]
        try:
            date, benchmark, subset, protocol, queries, ndcg, r1, r10, mrr, seconds = cells
            match = SUBSET.match(subset)
            assert match is not None  # the pattern matches any text
            value, _, interval = ndcg.partition(" [")
            low, high = interval.rstrip("]").split(", ") if interval else ("–", "–")
            metrics = {"ndcg_at_10": (_number(value), _number(low), _number(high))}
            metrics |= {m: (_number(f), None, None) for m, f in zip(TABLE_METRICS, (r1, r10, mrr))}
            found.append(
                Evaluation(
                    date=date,
                    benchmark=benchmarks.get(benchmark, benchmark),
                    subset=None if match.group(1) == "–" else match.group(1),
                    variant=match.group(2),
                    protocol=protocol,
                    n_queries=int(queries.replace(",", "")),
                    metrics={m: (v, lo, hi) for m, (v, lo, hi) in metrics.items() if v is not None},
                    seconds=_number(seconds),
                    id=f"card-row-{i + 1}",
                )
            )
        except ValueError:
            raise StorageError(
                f"the model card's evaluation row {i + 1} is not as cpr-ray wrote it ({line}); "
                "fix or remove it, then evaluate again"
            ) from None
    index = (meta.get("model-index") or [{}])[0].get("results") or []
    for entry in index:
        for at in range(len(found) - 1, -1, -1):
            mine = found[at].model_index_result()
            if (mine["task"], mine["dataset"]) == (entry.get("task"), entry.get("dataset")):
                shown = found[at].metrics
                updated = {
                    m["type"]: (m["value"], *shown.get(m["type"], (0, None, None))[1:])
                    for m in entry.get("metrics") or []
                    if m.get("type") in METRIC_NAMES
                }
                found[at] = dataclasses.replace(found[at], metrics=updated)
                break
    return found


def _read(storage: Storage, uri: str) -> str | None:
    """A file other writers replace, read whole in one request (a version, never a mix of two);
    None when there is none."""
    try:
        return storage.read_tagged(uri)[0].decode()
    except FileNotFoundError:
        return None


def read(storage: Storage, folder: str, card: str | None) -> list[Evaluation]:
    """The model's evaluations: its ledger's, or (no ledger yet) what its card `card` shows."""
    uri = join(folder, LEDGER)
    text = _read(storage, uri)
    return migrate(card or "") if text is None else from_json(text, uri)


def append(storage: Storage, folder: str, evaluation: Evaluation) -> None:
    """Add `evaluation` to the ledger of the model folder `folder` (its card's rows the first
    time, when there is no ledger yet)."""
    uri = join(folder, LEDGER)

    def add(text: str | None) -> str | None:
        have = (
            migrate(_read(storage, join(folder, CARD)) or "")
            if text is None
            else from_json(text, uri)
        )
        if any(e.id == evaluation.id for e in have):
            return text  # ours landed, though its reply was lost
        return json.dumps(to_json([*have, evaluation]), indent=1) + "\n"

    storage.update_text(uri, add)


def model_folder(model: str | None) -> bool:
    """`model` is a folder (local or s3://) that may hold a cpr-ray card, not a hub name."""
    if not model:
        return False
    if model.startswith("s3://"):
        return True
    return os.path.isdir(model.removeprefix("file://"))


def record(storage: Storage, model: str | None, evaluation: Evaluation) -> str | None:
    """Record `evaluation` in the model folder `model` when cpr-ray wrote its card: the ledger
    gets the entry, and the card its row and ``model-index``. The card's URI, or None where
    nothing was written (no folder, no card, another library's card)."""
    if not model_folder(model):
        return None
    assert model is not None
    card = join(model, CARD)
    try:
        text = _read(storage, card)
    except UnicodeDecodeError:
        return None
    if text is None or not is_cpr_card(text):
        return None
    append(storage, model, evaluation)
    storage.update_text(card, lambda now: render(storage, model, now))
    return card


def render(storage: Storage, model: str, card: str | None) -> str | None:
    """The card `card` of the folder `model` with the ledger's evaluations as they are now (read
    after the card, so a conditional write of the result never hides a newer entry)."""
    if card is None or not is_cpr_card(card):
        return None
    return with_evaluations(card, read(storage, model, card))
