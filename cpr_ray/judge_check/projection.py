"""What a full build would cost with the judge just measured: calls, tokens, USD, hours.

The measured means per answer (HTTP calls, prompt and completion tokens, seconds) are multiplied
by the rows each stage judges in a build:

- by default, the full-scale row counts of `benchmarks/SCALE.md` ("LLM calls and tokens per
  stage", which follows METHOD.md: ~132k pairs judged for analogy, ~91% of them discarded, so
  ~12k transfer checks and positives graded, and ≥ ~290k negatives graded: 150 per CPR-eval
  query and 9 per CPR-train pair);
- with `--root BUILD`, from the pairs the build's `mine` stage published, carried through the
  later stages by the same ratios (the method's pass rates, not this run's: the gold set is
  balanced by design, so its pass rates say nothing about a corpus).

USD is tokens × `llm.prices[model]` (per million prompt / completion tokens). Hours assume the
endpoint keeps every actor's requests in flight at the latency measured here:
hours = rows × seconds per answer / (llm.actors × llm.max_in_flight) / 3600.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cpr_ray.config import LLMConfig
from cpr_ray.errors import StorageError
from cpr_ray.stage import read_manifest
from cpr_ray.storage import Storage

# rows at full scale per judged stage, from benchmarks/SCALE.md ("LLM calls and tokens per stage")
SCALE_ROWS: dict[str, int] = {
    "judge-analogy": 132_000,
    "judge-transfer": 12_000,
    "score-positives": 12_000,
    "judge-negatives": 290_000,
}
SCALE_SOURCE = "benchmarks/SCALE.md full-scale rows (after METHOD.md)"
HOURS_FORMULA = "hours = rows × s/answer ÷ (llm.actors × llm.max_in_flight) ÷ 3600"


@dataclass(frozen=True)
class Measured:
    """Per-answer means of one stage's gold run (every case counts, answered or not)."""

    calls: float
    prompt_tokens: float
    completion_tokens: float
    seconds: float


def per_pair() -> dict[str, float]:
    """Rows each stage judges per mined pair: SCALE.md's rows over the pairs judged for analogy
    (transfer and positives: the ~9% of pairs the analogy judgment keeps)."""
    pairs = SCALE_ROWS["judge-analogy"]
    return {stage: rows / pairs for stage, rows in SCALE_ROWS.items()}


def rows_from_root(storage: Storage) -> tuple[dict[str, int], str]:
    """Rows per judged stage for the build at `storage`'s root, from its mined pairs."""
    manifest = read_manifest(storage, "mine")
    if manifest is None:
        raise StorageError(
            f"{storage.root} has no published mine stage (mine/_MANIFEST.json): --root needs a "
            "build mined at least through `mine`"
        )
    try:
        pairs = int(manifest["tables"]["pairs"]["rows"])
    except (KeyError, TypeError, ValueError):
        raise StorageError(f"{storage.root}: the mine manifest records no pairs table") from None
    rows = {stage: round(pairs * ratio) for stage, ratio in per_pair().items()}
    return rows, f"{pairs:,} mined pairs of {storage.root} × the method's pass rates (SCALE.md)"


def project(stage: str, rows: int, measured: Measured, llm: LLMConfig) -> dict[str, Any]:
    """A full build's calls, tokens, USD (None without a price for the stage's model) and hours
    for one stage."""
    model = llm.for_stage(stage)[0]
    prompt = rows * measured.prompt_tokens
    completion = rows * measured.completion_tokens
    price = llm.prices.get(model)
    usd = None
    if price is not None:
        usd = prompt / 1e6 * price.input_per_mtok + completion / 1e6 * price.output_per_mtok
    concurrency = llm.actors * llm.max_in_flight
    return {
        "rows": rows,
        "calls": round(rows * measured.calls),
        "prompt_tokens": round(prompt),
        "completion_tokens": round(completion),
        "usd": None if usd is None else round(usd, 2),
        "hours": round(rows * measured.seconds / concurrency / 3600, 2),
        "concurrency": concurrency,
        "model": model,
    }
