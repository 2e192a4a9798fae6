"""Tiny gold cases in the shipped format, written by tests (the shipped files are the gold
writers'; tests measure the machinery on cases whose labels they choose).

`gold_case(stage, i, label)` is one valid case: texts unique to (stage, i), so the scripted
endpoint (tests/standins/gold_llm.py) can tell the cases' prompts apart; `write_gold(folder, {stage:
[labels]})` writes a folder `cpr judge-check --gold` reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

WORDS = "grain river signal lattice enzyme ledger orbit canopy turbine vaccine".split()


def _text(stage: str, i: int, what: str) -> str:
    """A short lower-case text unique to (stage, i, what), with no marker the scripted
    endpoint reacts to."""
    tag = f"{stage.replace('-', ' ')} {what} {WORDS[i % 10]} {WORDS[(i // 10) % 10]} {i}"
    return f"a study of {tag} under changing conditions"


def expected_of(stage: str, label: Any, fails: list[str] | None = None) -> dict[str, Any]:
    if stage == "judge-analogy":
        return {"decision": label}
    if stage == "judge-transfer":
        if label == "transfer":
            return {"verdict": "transfer"}
        return {"verdict": "reject", "reject_reason": label}
    if stage == "write-queries":
        if label == "accept":
            return {"accept": True}
        return {"accept": False, "fails": fails or ["well_formed"]}
    if stage == "dedup":
        return {"same_problem": label == "same"}
    if stage == "strongest":
        return {"index": label}
    return {"score": label}


def _input(stage: str, i: int) -> dict[str, Any]:
    t = lambda what: _text(stage, i, what)  # noqa: E731
    paper = {"q_title": t("citing title"), "q_abstract": t("citing abstract")}
    contexts = [f"{t('context')} as shown in [CITATION]."]
    if stage == "judge-analogy":
        return {
            "base_id": 1000 + i,
            "cited_id": 2000 + i,
            **paper,
            "q_topic": "Hydrology",
            "d_title": t("cited title"),
            "d_abstract": t("cited abstract"),
            "d_topic": "Astronomy",
            "contexts": contexts,
        }
    if stage == "judge-transfer":
        return {
            "base_id": 1000 + i,
            "cited_id": 2000 + i,
            **paper,
            "d_title": t("cited title"),
            "d_abstract": t("cited abstract"),
            "contexts": contexts,
            "decision": "observed_analogy",
            "transfer_type": "method",
            "object_mappings": [
                {"q_object": "lake", "d_object": "oscillator", "role": "system"},
                {"q_object": "phosphorus", "d_object": "drive", "role": "control"},
            ],
            "shared_relations": [
                {
                    "predicate": "Drives",
                    "q_arguments": ["phosphorus", "lake"],
                    "d_arguments": ["drive", "oscillator"],
                }
            ],
            "transfer_path": {
                "from_d": "an indicator",
                "through_mappings": "lake as oscillator",
                "helps_q": "early warning",
            },
            "reason": "the citing text uses the indicator",
        }
    if stage == "write-queries":
        return {
            **paper,
            "contexts": contexts,
            "problem": t("problem"),
            "query": f"how to {t('query')}?",
        }
    if stage == "dedup":
        return {"query_a": f"how to {t('query a')}?", "query_b": f"how to {t('query b')}?"}
    if stage == "strongest":
        return {
            "base_id": 1000 + i,
            **paper,
            "candidates": [
                {
                    "cited_id": 2000 + 10 * i + k,
                    "d_title": t(f"candidate {k} title"),
                    "d_abstract": t(f"candidate {k} abstract"),
                    "contexts": contexts,
                    "mappings": "lake -> oscillator (system)",
                }
                for k in range(3)
            ],
        }
    return {
        "query": f"how to {t('query')}?",
        "passage": f"{t('passage title')}. {t('passage abstract')}",
        "mappings": "lake -> oscillator (system)" if stage == "score-positives" else None,
    }


def gold_case(
    stage: str,
    i: int,
    label: Any,
    *,
    second: Any = "same",
    synthetic: bool = True,
    fails: list[str] | None = None,
) -> dict[str, Any]:
    """One valid case with two readings (`second`: the second reader's label, the first's by
    default; where it differs, the first wins by adjudication)."""
    expected = expected_of(stage, label, fails)
    exclusion = "background_only" if label == "not_analogy" else None
    first = {"reader": "first", "expected": expected, "why": "the first reading"}
    other = label if second == "same" else second
    other_exclusion = "background_only" if other == "not_analogy" else None
    reading = {"reader": "second", "expected": expected_of(stage, other, fails), "why": "again"}
    for r, e in ((first, exclusion), (reading, other_exclusion)):
        if e:
            r["exclusion"] = e
    case: dict[str, Any] = {
        "id": f"{stage}-{i}",
        "covers": f"label:{label}",
        "rule": "a rule of METHOD.md",
        "why": "one sentence on why",
        "synthetic": synthetic,
        "sources": [] if synthetic else [1000 + i, 2000 + i],
        "input": _input(stage, i),
        "expected": expected,
        "readings": [first, reading],
    }
    if exclusion:
        case["exclusion"] = exclusion
    if stage in ("judge-analogy", "judge-transfer", "write-queries"):
        case["citing_sentence"] = "invented" if synthetic else "real"
    if other != label:
        case["adjudication"] = "the first reading follows the rule"
    return case


def write_gold(folder: Path, labels: dict[str, list[Any]], **kw: Any) -> Path:
    """A gold folder with one file per stage, the cases labelled in order."""
    folder.mkdir(parents=True, exist_ok=True)
    for stage, stage_labels in labels.items():
        lines = [json.dumps(gold_case(stage, i, lab, **kw)) for i, lab in enumerate(stage_labels)]
        (folder / f"{stage}.jsonl").write_text("\n".join(lines) + "\n")
    return folder
