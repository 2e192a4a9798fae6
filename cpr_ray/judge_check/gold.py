"""The gold set the judges are measured on, and its loader.

One JSON-lines file per judged stage under `gold/` (shipped as package data), one case a line
(`notes` of the issue: GOLD_FORMAT; docs/judges.md's judge-check section says it for users):

    {"id": "...", "covers": "exclusion:surface_similarity", "rule": "P2 reject: surface ...",
     "why": "one sentence", "synthetic": false, "sources": [1234567, 7654321],
     "input": {...the task's key columns...}, "expected": {...the adjudicated label...},
     "exclusion": "...",
     "readings": [{"reader": "first", "expected": {...}, "exclusion": "...", "why": "..."},
                  {"reader": "second", "expected": {...}, "why": "..."}],
     "adjudication": "present only when the two readings differ: which wins and why"}

`expected` per stage: `{"decision": ...}` (judge-analogy, with a top-level `exclusion` on
not_analogy cases: the exclusion that should fire, or `no_structure`), `{"verdict":
"transfer"}` or `{"verdict": "reject", "reject_reason": ...}` (judge-transfer), `{"score": 0-3}`
(score-positives, judge-negatives), `{"accept": true}` or `{"accept": false, "fails": [...]}`
(write-queries: the review step; `fails` the review booleans that are false),
`{"same_problem": bool}` (dedup), `{"index": n}` (strongest: 1-based, as the prompt numbers the
candidates).

Every case is checked when loaded — the fields a stage needs, their types, the labels in range,
and the method's own rules on the input (a passing first judgment has two mappings and a shared
relation over distinct mapped objects, a strongest index names a candidate) — because a
malformed gold case would silently measure the judge against a wrong answer; the error names the
file and the line.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, get_args

from cpr_ray import stages as registry
from cpr_ray.errors import InputError
from cpr_ray.queries.analogy import (
    CONTRIBUTIONS,
    MIN_ARGUMENTS,
    PASSING,
    Decision,
    RejectReason,
    TransferType,
)
from cpr_ray.queries.analogy import EXCLUSIONS as ANALOGY_EXCLUSIONS
from cpr_ray.queries.dedup import CANDIDATE, MAX_CANDIDATES
from cpr_ray.stages import (
    DEDUP,
    JUDGE_ANALOGY,
    JUDGE_NEGATIVES,
    JUDGE_TRANSFER,
    SCORE_POSITIVES,
    STRONGEST,
    WRITE_QUERIES,
)
from cpr_ray.tables.schemas import PASSAGE_CHARS

MAX_TITLE_CHARS = 400  # a passage is its title, read whole, then the cut abstract

# the gold sets, in build order (the registry's: each names the task it measures)
JUDGE_STAGES: tuple[str, ...] = tuple(registry.GOLD)
# the build stage whose task, model and prices a gold set's judge uses where it is not the
# stage of its own name (the strongest-analogy choice is a second call of the dedup stage)
BUILD_STAGE: dict[str, str] = {g: s for g, s in registry.GOLD_STAGE.items() if g != s}
# what the analogy judge must rule out before accepting (METHOD.md §3.2 P2), same problem first
EXCLUSIONS: tuple[str, ...] = ("same_problem", *ANALOGY_EXCLUSIONS)
NO_STRUCTURE = "no_structure"  # not an analogy though no exclusion fires: nothing is shared
DECISIONS: tuple[str, ...] = get_args(Decision)
TRANSFER_LABELS: tuple[str, ...] = ("transfer", *get_args(RejectReason))
SCORES: tuple[int, ...] = (0, 1, 2, 3)
REVIEW_FAILS: tuple[str, ...] = ("problem_only", "grounded", "well_formed")
LABELS: dict[str, tuple[Any, ...]] = {
    JUDGE_ANALOGY: DECISIONS,
    JUDGE_TRANSFER: TRANSFER_LABELS,
    WRITE_QUERIES: ("accept", "reject"),
    DEDUP: ("same", "different"),
    STRONGEST: tuple(range(1, MAX_CANDIDATES + 1)),
    SCORE_POSITIVES: SCORES,
    JUDGE_NEGATIVES: SCORES,
}
CASE_KEYS = frozenset(
    {
        "id",
        "covers",
        "rule",
        "why",
        "synthetic",
        "sources",
        "input",
        "expected",
        "exclusion",
        "readings",
        "adjudication",
        "purpose",
        "topics",
        "citing_sentence",
    }
)
# the stages whose input holds citing sentences: each case says whether its sentences are real
# (a paper's own, as a build sends them), invented, or absent (a pair a build no longer judges)
CONTEXT_STAGES: tuple[str, ...] = (JUDGE_ANALOGY, JUDGE_TRANSFER, WRITE_QUERIES)
CITING_SENTENCES: tuple[str, ...] = ("real", "invented", "none")
# the citation set's human label of a citation's purpose (reference/citation-contexts): kept on
# the case, never shown to the judge; the first three say q took nothing from d
PURPOSES: tuple[str, ...] = (
    "BACKGROUND",
    "COMPARES_CONTRASTS",
    "EXTENSION",
    "FUTURE",
    "MOTIVATION",
    "USES",
)
NOT_TAKEN: tuple[str, ...] = ("BACKGROUND", "COMPARES_CONTRASTS", "FUTURE")
TOPIC_KEYS = ("q_field", "q_topic", "d_field", "d_topic")
CITATION_KEYS = ("unique_id", "core_id")
READING_KEYS = frozenset({"reader", "expected", "exclusion", "why"})
READERS = ("first", "second")
PATH_KEYS = ("from_d", "through_mappings", "helps_q")
REVIEW_COLUMNS = ("q_title", "q_abstract", "contexts", "problem", "query")


def build_stage(stage: str) -> str:
    """The build stage a judged stage belongs to (its model, prices and rows)."""
    return BUILD_STAGE.get(stage, stage)


def kept(stage: str, label: Any) -> bool | None:
    """The binary the method reports for a label: does the judge let the row through?

    Analogy: observed or potential; transfer: a transfer verdict; positives: usefulness ≥ 2;
    negatives: usefulness ≤ 1 (kept as a negative — the same split at 2 as the method's κ, seen
    from the side a build keeps); write-queries: accepted; dedup: same problem (the query is
    dropped as a duplicate: a false "same" loses a query). None: no usable answer, or a stage
    without a binary (strongest: the label is an index)."""
    if label is None or stage == STRONGEST:
        return None
    if stage == JUDGE_ANALOGY:
        return label in PASSING
    if stage == JUDGE_TRANSFER:
        return label == "transfer"
    if stage == SCORE_POSITIVES:
        return label >= 2
    if stage == JUDGE_NEGATIVES:
        return label < 2
    if stage == WRITE_QUERIES:
        return label == "accept"
    return label == "same"


@dataclass(frozen=True)
class Reading:
    """One reader's label of a case (the gold's own agreement is measured between two)."""

    reader: str
    label: Any
    exclusion: str | None
    fails: tuple[str, ...] | None
    why: str


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
    rule: str = ""
    synthetic: bool = True
    sources: tuple[int, ...] = ()  # S2 corpus ids, for a case taken from the bundled sample
    readings: tuple[Reading, ...] = ()
    adjudication: str | None = None
    fails: tuple[str, ...] | None = None  # write-queries: the review booleans that are false
    citation: dict[str, str] | None = None  # the citation set's unique_id and core_id
    purpose: str | None = None  # the citation set's purpose label (never shown to the judge)
    topics: dict[str, Any] | None = None  # hand-assigned field and topic of each paper
    citing_sentence: str | None = None  # CONTEXT_STAGES: real, invented or none


def key_columns(stage: str) -> tuple[str, ...]:
    """The columns the stage's real task reads (so the gold follows the task, not a copy)."""
    from cpr_ray.judge_check.tasks import make_task

    return tuple(make_task(stage).key_columns)


def gold_path(stage: str, folder: Path | None = None) -> Path:
    """The gold file of a stage: shipped, or in `folder` (`cpr judge-check --gold DIR`)."""
    if stage not in JUDGE_STAGES:
        raise InputError(
            f"no gold set for stage {stage!r}; judged stages: {', '.join(JUDGE_STAGES)}"
        )
    if folder is not None:
        return folder / f"{stage}.jsonl"
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
    for key in ("id", "covers", "rule", "why"):
        _text(raw, key)
    for key in ("input", "expected"):
        if not isinstance(raw.get(key), dict):
            raise ValueError(f"{key!r} must be an object")
    synthetic, sources, citation = _provenance(raw)
    row = raw["input"]
    missing = [c for c in columns if c not in row]
    if missing:
        raise ValueError(f"input lacks column(s) {', '.join(missing)} that {stage} reads")
    extra = sorted(set(row) - set(columns))
    if extra:
        raise ValueError(f"input has column(s) {', '.join(extra)} that {stage} does not read")
    for column in columns:
        _check_column(row, column)
    _method_rules(stage, row)
    label, fails = _label(stage, raw["expected"], row)
    exclusion = _exclusion(stage, label, raw.get("exclusion"), "")
    readings = _readings(stage, raw.get("readings"), row)
    purpose, topics = _citation_fields(raw, citation)
    _adjudicated(
        raw, (label, exclusion, fails), readings, observed_on_not_taken(stage, label, purpose)
    )
    citing = _citing_sentence(stage, raw, row, synthetic)
    return GoldCase(
        stage,
        raw["id"],
        raw["covers"],
        raw["why"],
        row,
        label,
        exclusion,
        where,
        rule=raw["rule"],
        synthetic=synthetic,
        sources=sources,
        readings=readings,
        adjudication=raw.get("adjudication"),
        fails=fails,
        citation=citation,
        purpose=purpose,
        topics=topics,
        citing_sentence=citing,
    )


def _provenance(raw: dict[str, Any]) -> tuple[bool, tuple[int, ...], dict[str, str] | None]:
    """`synthetic` and `sources`: a real case names where its text comes from, either the S2
    corpus ids of the bundled sample (a list) or the citation set's citation and citing paper
    (`{"unique_id": ..., "core_id": ...}`)."""
    synthetic = raw.get("synthetic")
    if not isinstance(synthetic, bool):
        raise ValueError("'synthetic' must be true (invented text) or false (real text)")
    sources = raw.get("sources")
    if isinstance(sources, dict):
        if set(sources) != set(CITATION_KEYS) or not all(
            isinstance(v, str) and v for v in sources.values()
        ):
            raise ValueError("'sources' of a citation-set case must be {unique_id, core_id}")
        if synthetic:
            raise ValueError("a case from the citation set is real text: synthetic false")
        return synthetic, (), dict(sources)
    if not isinstance(sources, list) or not all(
        isinstance(s, int) and not isinstance(s, bool) for s in sources
    ):
        raise ValueError(
            "'sources' must be a list of S2 corpus ids (integers) or {unique_id, core_id}"
        )
    if not synthetic and not sources:
        raise ValueError("a real case (synthetic false) must name its 'sources' (corpus ids)")
    return synthetic, tuple(sources), None


def _citation_fields(
    raw: dict[str, Any], citation: dict[str, str] | None
) -> tuple[str | None, dict[str, Any] | None]:
    """A citation-set case keeps the citation's purpose label and each paper's hand-assigned
    field and topic; its topics differ (a build judges only topic-disjoint pairs)."""
    purpose, topics = raw.get("purpose"), raw.get("topics")
    if citation is None:
        if purpose is not None or topics is not None:
            raise ValueError("'purpose' and 'topics' belong to cases from the citation set")
        return None, None
    if purpose not in PURPOSES:
        raise ValueError(f"'purpose' must be one of {', '.join(PURPOSES)}")
    if not isinstance(topics, dict) or set(topics) - {"adjudication"} != {
        *TOPIC_KEYS,
        "cross_field",
    }:
        raise ValueError(
            f"'topics' must be an object of {', '.join(TOPIC_KEYS)}, cross_field (and an "
            "adjudication where the readers disagreed on them)"
        )
    for key in TOPIC_KEYS:
        _text(topics, key, "topics.")
    if topics["q_topic"] == topics["d_topic"]:
        raise ValueError("the two papers share a topic: a build judges only topic-disjoint pairs")
    if topics["cross_field"] is not (topics["q_field"] != topics["d_field"]):
        raise ValueError("topics.cross_field must say whether the two fields differ")
    return purpose, dict(topics)


def _citing_sentence(
    stage: str, raw: dict[str, Any], row: dict[str, Any], synthetic: bool
) -> str | None:
    """Where a stage reads citing sentences, the case says what they are: real, invented, or
    none (the input holds none)."""
    value = raw.get("citing_sentence")
    if stage not in CONTEXT_STAGES:
        if value is not None:
            raise ValueError(f"'citing_sentence' belongs to {', '.join(CONTEXT_STAGES)} cases")
        return None
    if value not in CITING_SENTENCES:
        raise ValueError(f"'citing_sentence' must be one of {', '.join(CITING_SENTENCES)}")
    if (value == "none") != (not row["contexts"]):
        raise ValueError("'citing_sentence' is none exactly when the input holds no contexts")
    if value == "real" and synthetic:
        raise ValueError("a synthetic case has no real citing sentence")
    return value


def _exclusion(stage: str, label: Any, exclusion: Any, where: str) -> str | None:
    if stage == JUDGE_ANALOGY and label == "not_analogy":
        allowed = (*EXCLUSIONS, NO_STRUCTURE)
        if exclusion not in allowed:
            raise ValueError(
                f"{where}a not_analogy case needs 'exclusion', one of: {', '.join(allowed)}"
            )
        return exclusion
    if exclusion is not None:
        raise ValueError(f"{where}'exclusion' belongs only to not_analogy cases of judge-analogy")
    return None


def _readings(stage: str, value: Any, row: dict[str, Any]) -> tuple[Reading, ...]:
    """Two readings, first then second (the second blind to the first)."""
    if not isinstance(value, list) or len(value) != len(READERS):
        raise ValueError("'readings' must be a list of 2 readings (first, then second)")
    readings = []
    for i, reading in enumerate(value):
        where = f"readings[{i}]: "
        if not isinstance(reading, dict):
            raise ValueError(f"{where}a reading must be an object")
        unknown = set(reading) - READING_KEYS
        if unknown:
            raise ValueError(f"{where}unknown field(s) {sorted(unknown)}")
        if reading.get("reader") != READERS[i]:
            raise ValueError(f"{where}'reader' must be {READERS[i]!r}")
        _text(reading, "why", where)
        if not isinstance(reading.get("expected"), dict):
            raise ValueError(f"{where}'expected' must be an object")
        try:
            label, fails = _label(stage, reading["expected"], row)
        except ValueError as exc:
            raise ValueError(f"{where}{exc}") from None
        exclusion = _exclusion(stage, label, reading.get("exclusion"), where)
        readings.append(Reading(READERS[i], label, exclusion, fails, reading["why"]))
    return tuple(readings)


def observed_on_not_taken(stage: str, label: Any, purpose: str | None) -> bool:
    """A pass as observed on a citation its purpose label says q took nothing from (background,
    comparison, future work): the citing sentence contradicts it, so it is worth a second look."""
    passing = {JUDGE_ANALOGY: "observed_analogy", JUDGE_TRANSFER: "transfer"}.get(stage)
    return passing is not None and label == passing and purpose in NOT_TAKEN


def _adjudicated(
    raw: dict[str, Any], final: tuple[Any, ...], readings: Sequence[Reading], contradicted: bool
) -> None:
    """`expected` is the readings' label when they agree, and an adjudication's when not: the
    adjudicator may side with either reading or find a third label the texts support, and the
    sentence that says why is the record of it. A pass as observed on a citation labelled
    background, comparison or future work needs that sentence even when the readings agree."""
    labels = [(r.label, r.exclusion, r.fails) for r in readings]
    adjudication = raw.get("adjudication")
    said = isinstance(adjudication, str) and bool(adjudication.strip())
    if len(set(labels)) > 1 or contradicted:
        if not said:
            raise ValueError(
                "the two readings differ, or the case passes a citation labelled background, "
                "comparison or future work: 'adjudication' must say in one sentence why"
            )
        if len(set(labels)) > 1:
            return
    elif adjudication is not None:
        raise ValueError("'adjudication' belongs only to a case whose two readings differ")
    if final != labels[0]:
        raise ValueError(
            "'expected' (and 'exclusion') must equal the readings' label when they agree"
        )


def _label(
    stage: str, expected: dict[str, Any], row: dict[str, Any]
) -> tuple[Any, tuple[str, ...] | None]:
    """(the label κ compares, the review's fails for write-queries)."""
    if stage == JUDGE_ANALOGY:
        _only(expected, {"decision"})
        return _one_of(expected, "decision", DECISIONS), None
    if stage == JUDGE_TRANSFER:
        _only(expected, {"verdict", "reject_reason"})
        verdict = _one_of(expected, "verdict", ("transfer", "reject"))
        reason = expected.get("reject_reason")
        if verdict == "transfer":
            if reason is not None:
                raise ValueError("expected verdict transfer takes no reject_reason")
            return "transfer", None
        return _one_of(expected, "reject_reason", get_args(RejectReason)), None
    if stage == WRITE_QUERIES:
        return _review_label(expected)
    if stage == DEDUP:
        _only(expected, {"same_problem"})
        same = expected.get("same_problem")
        if not isinstance(same, bool):
            raise ValueError("expected same_problem must be true or false")
        return ("same" if same else "different"), None
    if stage == STRONGEST:
        _only(expected, {"index"})
        index, n = expected.get("index"), len(row["candidates"])
        if isinstance(index, bool) or not isinstance(index, int) or not 1 <= index <= n:
            raise ValueError(
                f"expected index must name a candidate of the group (1 to {n}), got {index!r}"
            )
        return index, None
    _only(expected, {"score"})
    score = expected.get("score")
    if isinstance(score, bool) or score not in SCORES:
        raise ValueError(f"expected score must be one of {list(SCORES)}, got {score!r}")
    return score, None


def _review_label(expected: dict[str, Any]) -> tuple[str, tuple[str, ...] | None]:
    """write-queries: accept, or reject naming the review booleans that are false."""
    _only(expected, {"accept", "fails"})
    accept, fails = expected.get("accept"), expected.get("fails")
    if not isinstance(accept, bool):
        raise ValueError("expected accept must be true or false")
    if accept:
        if fails:
            raise ValueError("an accepted query has no 'fails'")
        return "accept", None
    if not isinstance(fails, list) or not fails:
        raise ValueError(
            f"a rejected query must name its 'fails', some of: {', '.join(REVIEW_FAILS)}"
        )
    wrong = [f for f in fails if f not in REVIEW_FAILS]
    if wrong or len(set(fails)) != len(fails):
        raise ValueError(
            f"expected fails must be distinct names among {', '.join(REVIEW_FAILS)}, got {fails}"
        )
    return "reject", tuple(sorted(fails, key=REVIEW_FAILS.index))


def _method_rules(stage: str, row: dict[str, Any]) -> None:
    """The method's own rules on a case's input: a case that breaks them could not come out of
    a build (the judge would be measured on an impossible row)."""
    if stage == JUDGE_TRANSFER:
        if row["decision"] not in PASSING:
            raise ValueError(
                f"input decision {row['decision']}: the verifier only sees pairs the analogy "
                f"judge passed ({', '.join(PASSING)})"
            )
        if row["transfer_type"] not in CONTRIBUTIONS:
            raise ValueError(
                f"input transfer_type {row['transfer_type']}: a passing judgment carries a "
                f"contribution of d ({', '.join(CONTRIBUTIONS)})"
            )
        mappings = row["object_mappings"]
        if len(mappings) < 2 or not row["shared_relations"]:
            raise ValueError(
                f"input decision {row['decision']} passes, so the first judgment needs at least "
                "two object mappings and one shared relation (METHOD.md §3.2 P2)"
            )
    if stage == JUDGE_TRANSFER:
        pairs = {(m["q_object"], m["d_object"]) for m in row["object_mappings"]}
        for i, r in enumerate(row["shared_relations"]):
            args = list(zip(r["q_arguments"], r["d_arguments"], strict=False))
            if len(r["q_arguments"]) != len(r["d_arguments"]) or len(args) < MIN_ARGUMENTS:
                raise ValueError(
                    f"input shared_relations[{i}] must hold over {MIN_ARGUMENTS} or more mapped "
                    "objects, as many on each side"
                )
            if any(a not in pairs for a in args) or len(set(args)) != len(args):
                raise ValueError(
                    f"input shared_relations[{i}] ({r['predicate']}): its arguments must be "
                    "distinct object mappings (each q argument with the d argument it maps to)"
                )
    if stage == STRONGEST:
        n = len(row["candidates"])
        if not 2 <= n <= MAX_CANDIDATES:
            raise ValueError(f"input 'candidates' must hold 2 to {MAX_CANDIDATES}, not {n}")


def _only(expected: dict[str, Any], keys: set[str]) -> None:
    unknown = set(expected) - keys
    if unknown:
        raise ValueError(
            f"expected has unknown field(s) {sorted(unknown)}; allowed: {sorted(keys)}"
        )


def _one_of(obj: dict[str, Any], key: str, allowed: Sequence[str]) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or value not in allowed:
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
    elif column == "candidates":
        _check_candidates(value)
    elif column == "transfer_type":
        if value not in get_args(TransferType):
            raise ValueError(
                f"input 'transfer_type' must be one of {', '.join(get_args(TransferType))}"
            )
    else:
        _text(row, column, "input ")
        if column == "passage" and len(value) > PASSAGE_CHARS + MAX_TITLE_CHARS:
            raise ValueError(
                f"input 'passage' is longer than a grader reads (schemas.passages: the title, "
                f"then {PASSAGE_CHARS} characters of the abstract)"
            )


def _check_candidates(value: Any) -> None:
    """The candidates of a strongest-analogy group, as `strongest_requests` builds them."""
    fields = [f.name for f in CANDIDATE]
    if not isinstance(value, list):
        raise ValueError("input 'candidates' must be a list")
    for i, c in enumerate(value):
        where = f"input candidates[{i}]"
        if not isinstance(c, dict) or set(c) != set(fields):
            raise ValueError(f"{where} must be an object of {', '.join(fields)}")
        if isinstance(c["cited_id"], bool) or not isinstance(c["cited_id"], int):
            raise ValueError(f"{where}.cited_id must be an integer id")
        for key in ("d_title", "d_abstract"):
            _text(c, key, f"{where}.")
        _strings(c["contexts"], f"{where}.contexts")
        if c["mappings"] is not None and not (isinstance(c["mappings"], str) and c["mappings"]):
            raise ValueError(f"{where}.mappings must be null or a non-empty string")


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
