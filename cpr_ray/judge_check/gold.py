"""The gold set the judges are measured on, and its loader.

One JSON-lines file per judged stage under `gold/` (shipped as package data), one case a line:

    {"id": "...", "covers": "exclusion:surface_similarity", "why": "one sentence",
     "input": {...the task's key columns...}, "expected": {...}, "exclusion": "..."}

`expected` is `{"decision": ...}` (judge-analogy), `{"verdict": "transfer"}` or `{"verdict":
"reject", "reject_reason": ...}` (judge-transfer), `{"score": 0-3}` (score-positives,
judge-negatives); `exclusion` is only on not_analogy cases of judge-analogy (the exclusion that
should fire, or `no_structure` when none does and the pair simply lacks shared structure).

Every case is checked when loaded — the fields a stage needs, their types, the labels in range —
because a malformed gold case would silently measure the judge against a wrong answer; the error
names the file and the line.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, get_args

from cpr_ray.errors import InputError
from cpr_ray.queries.analogy import EXCLUSIONS as ANALOGY_EXCLUSIONS
from cpr_ray.queries.analogy import Decision, RejectReason, TransferType
from cpr_ray.schemas import PASSAGE_CHARS

JUDGE_STAGES: tuple[str, ...] = (
    "judge-analogy",
    "judge-transfer",
    "score-positives",
    "judge-negatives",
)
# what the analogy judge must rule out before accepting (METHOD.md §3.2 P2), same problem first
EXCLUSIONS: tuple[str, ...] = ("same_problem", *ANALOGY_EXCLUSIONS)
NO_STRUCTURE = "no_structure"  # not an analogy though no exclusion fires: nothing is shared
DECISIONS: tuple[str, ...] = get_args(Decision)
TRANSFER_LABELS: tuple[str, ...] = ("transfer", *get_args(RejectReason))
SCORES: tuple[int, ...] = (0, 1, 2, 3)
LABELS: dict[str, tuple[Any, ...]] = {
    "judge-analogy": DECISIONS,
    "judge-transfer": TRANSFER_LABELS,
    "score-positives": SCORES,
    "judge-negatives": SCORES,
}
CASE_KEYS = frozenset({"id", "covers", "why", "input", "expected", "exclusion"})
PATH_KEYS = ("from_d", "through_mappings", "helps_q")


@dataclass(frozen=True)
class GoldCase:
    """One hand-labelled case: the row a task reads and the label the judge should reach."""

    stage: str
    id: str
    covers: str
    why: str
    input: dict[str, Any]
    label: Any  # what agreement and κ compare: a decision, "transfer"/a reject reason, a score
    exclusion: str | None
    source: str  # FILE:LINE, for messages


def key_columns(stage: str) -> tuple[str, ...]:
    """The columns the stage's real task reads (so the gold follows the task, not a copy)."""
    from cpr_ray.dataset.negatives import NegativeGrader
    from cpr_ray.queries.judges import AnalogyJudge, TransferVerifier
    from cpr_ray.queries.usefulness import UsefulnessGrader

    tasks = {
        "judge-analogy": AnalogyJudge,
        "judge-transfer": TransferVerifier,
        "score-positives": UsefulnessGrader,
        "judge-negatives": NegativeGrader,
    }
    return tuple(tasks[stage].key_columns)


def gold_path(stage: str) -> Path:
    """The shipped gold file of a stage."""
    if stage not in JUDGE_STAGES:
        raise InputError(
            f"no gold set for stage {stage!r}; judged stages: {', '.join(JUDGE_STAGES)}"
        )
    return Path(str(resources.files("cpr_ray.judge_check") / "gold" / f"{stage}.jsonl"))


def load_gold(stage: str, path: Path | None = None) -> list[GoldCase]:
    """Every case of a stage's gold file, checked; the first problem stops with FILE:LINE."""
    path = path or gold_path(stage)
    if not path.is_file():
        raise InputError(f"{path}: gold file not found")
    columns = key_columns(stage)
    cases: list[GoldCase] = []
    seen: set[str] = set()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        try:
            case = _case(stage, raw, columns, where)
        except ValueError as exc:
            raise InputError(f"{where}: {exc}") from None
        if case.id in seen:
            raise InputError(f"{where}: case id {case.id!r} appears twice")
        seen.add(case.id)
        cases.append(case)
    if not cases:
        raise InputError(f"{path}: holds no gold case")
    return cases


def _case(stage: str, raw: Any, columns: Sequence[str], where: str) -> GoldCase:
    if not isinstance(raw, dict):
        raise ValueError("a gold case must be a JSON object")
    unknown = set(raw) - CASE_KEYS
    if unknown:
        raise ValueError(f"unknown field(s) {sorted(unknown)}; allowed: {sorted(CASE_KEYS)}")
    for key in ("id", "covers", "why"):
        _text(raw, key)
    for key in ("input", "expected"):
        if not isinstance(raw.get(key), dict):
            raise ValueError(f"{key!r} must be an object")
    row = raw["input"]
    missing = [c for c in columns if c not in row]
    if missing:
        raise ValueError(f"input lacks column(s) {', '.join(missing)} that {stage} reads")
    extra = sorted(set(row) - set(columns))
    if extra:
        raise ValueError(f"input has column(s) {', '.join(extra)} that {stage} does not read")
    for column in columns:
        _check_column(row, column)
    label = _label(stage, raw["expected"])
    exclusion = raw.get("exclusion")
    if stage == "judge-analogy" and label == "not_analogy":
        allowed = (*EXCLUSIONS, NO_STRUCTURE)
        if exclusion not in allowed:
            raise ValueError(f"a not_analogy case needs 'exclusion', one of: {', '.join(allowed)}")
    elif exclusion is not None:
        raise ValueError("'exclusion' belongs only to not_analogy cases of judge-analogy")
    return GoldCase(stage, raw["id"], raw["covers"], raw["why"], row, label, exclusion, where)


def _label(stage: str, expected: dict[str, Any]) -> Any:
    if stage == "judge-analogy":
        _only(expected, {"decision"})
        return _one_of(expected, "decision", DECISIONS)
    if stage == "judge-transfer":
        _only(expected, {"verdict", "reject_reason"})
        verdict = _one_of(expected, "verdict", ("transfer", "reject"))
        reason = expected.get("reject_reason")
        if verdict == "transfer":
            if reason is not None:
                raise ValueError("expected verdict transfer takes no reject_reason")
            return "transfer"
        return _one_of(expected, "reject_reason", get_args(RejectReason))
    _only(expected, {"score"})
    score = expected.get("score")
    if isinstance(score, bool) or score not in SCORES:
        raise ValueError(f"expected score must be one of {list(SCORES)}, got {score!r}")
    return score


def _only(expected: dict[str, Any], keys: set[str]) -> None:
    unknown = set(expected) - keys
    if unknown:
        raise ValueError(
            f"expected has unknown field(s) {sorted(unknown)}; allowed: {sorted(keys)}"
        )


def _one_of(obj: dict[str, Any], key: str, allowed: Sequence[str]) -> str:
    value = obj.get(key)
    if value not in allowed:
        raise ValueError(f"expected {key} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def _text(obj: dict[str, Any], key: str, where: str = "") -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}{key!r} must be a non-empty string")
    return value


def _strings(value: Any, what: str) -> None:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ValueError(f"{what} must be a list of non-empty strings")


def _check_column(row: dict[str, Any], column: str) -> None:
    """The type each column has in the pipeline's tables (a task reads a row as they give it)."""
    value = row[column]
    if column in ("base_id", "cited_id"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"input {column!r} must be an integer id")
    elif column == "contexts":
        _strings(value, "input 'contexts'")
    elif column == "mappings":
        if value is not None and not (isinstance(value, str) and value.strip()):
            raise ValueError("input 'mappings' must be null or a non-empty string")
    elif column == "object_mappings":
        if not isinstance(value, list):
            raise ValueError("input 'object_mappings' must be a list")
        for i, m in enumerate(value):
            if not isinstance(m, dict):
                raise ValueError(f"input object_mappings[{i}] must be an object")
            for key in ("q_object", "d_object", "role"):
                _text(m, key, f"input object_mappings[{i}].")
    elif column == "shared_relations":
        if not isinstance(value, list):
            raise ValueError("input 'shared_relations' must be a list")
        for i, r in enumerate(value):
            if not isinstance(r, dict):
                raise ValueError(f"input shared_relations[{i}] must be an object")
            _text(r, "predicate", f"input shared_relations[{i}].")
            for side in ("q_arguments", "d_arguments"):
                _strings(r.get(side), f"input shared_relations[{i}].{side}")
    elif column == "transfer_path":
        if not isinstance(value, dict) or set(value) != set(PATH_KEYS):
            raise ValueError(f"input 'transfer_path' must be an object of {', '.join(PATH_KEYS)}")
        for key in PATH_KEYS:
            _text(value, key, "input transfer_path.")
    elif column == "decision":
        if value not in DECISIONS:
            raise ValueError(f"input 'decision' must be one of {', '.join(DECISIONS)}")
    elif column == "transfer_type":
        if value not in get_args(TransferType):
            raise ValueError(
                f"input 'transfer_type' must be one of {', '.join(get_args(TransferType))}"
            )
    else:
        _text(row, column, "input ")
        if column == "passage" and len(value) > PASSAGE_CHARS:
            raise ValueError(
                f"input 'passage' is longer than the {PASSAGE_CHARS} characters a "
                "grader reads (schemas.passages)"
            )


def select(cases: Sequence[GoldCase], limit: int | None) -> list[GoldCase]:
    """At most `limit` cases, taken in turn from each label (in file order), so a quick check
    with `--limit` still sees several labels instead of the file's first block."""
    if limit is None or limit >= len(cases):
        return list(cases)
    by_label: dict[Any, list[GoldCase]] = {}
    for case in cases:
        by_label.setdefault(case.label, []).append(case)
    queues = list(by_label.values())
    picked: list[GoldCase] = []
    while len(picked) < limit:
        for queue in queues:
            if queue and len(picked) < limit:
                picked.append(queue.pop(0))
    order = {c.id: i for i, c in enumerate(cases)}
    return sorted(picked, key=lambda c: order[c.id])
