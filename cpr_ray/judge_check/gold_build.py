"""Assemble the gold files' real cases from the citation set and its two blind readings.

The citation set (`reference/citation-contexts/`: real citing sentences, the cited papers' titles
and abstracts, a human purpose label per citation, the citing papers' first pages) was read twice
for the analogy judge, each reader blind to the other (`LABELLING.md` beside the readings); the
transfer and query-review cases were written from it and read twice the same way. This module
turns those readings into gold lines (`gold.py`'s format) and merges them with the cases already
shipped, so the gold can be rebuilt whenever a reading or an adjudication changes (it also
rewrites the labels folder's `citing-abstracts.json`, the citing papers' texts the readers use):

    python -m cpr_ray.judge_check.gold_build --labels /work/labels \\
        --citations ../shared/reference/citation-contexts --out cpr_ray/judge_check/gold

Choices it encodes, each a rule so that a rebuilt gold is the same gold:
- an analogy case is kept when both readers found the cited abstract to be the cited work's and
  both gave the two papers different topics (a build judges only topic-disjoint pairs); a topic
  adjudication (`topic-adjudications.jsonl`) settles the rows where they disagree on that. The
  citing paper needs an abstract on its first pages (`first_pages.py`): a build sends one.
- q's title, abstract and topic, d's title and abstract are copied as the set and the pages hold
  them; the recorded topics are the first reader's, or the adjudicated ones.
- the citing sentence's `#AUTHOR_TAG` (where the set removed the cited reference) becomes the
  cited paper's first author's surname: in the author–year styles most of the set uses the tag
  replaced exactly that name ("#AUTHOR_TAG et al., 2013"), so the sentence reads as the
  sentence S2 gives a build, its other references left as printed.
- the final label is the readings' when they agree; when both reject with different exclusions,
  the one that comes first in the method's order decides (same problem first, then
  `EXCLUSIONS`' order, `no_structure` last), said in the adjudication line; every other
  difference, and every passing label on a citation the set calls background, comparison or
  future work, takes a hand adjudication (`adjudications.jsonl`), and a missing one stops the
  build with the case named.
"""

from __future__ import annotations

import argparse
import csv
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cpr_ray import stages
from cpr_ray.judge_check.first_pages import read_first_page_file
from cpr_ray.judge_check.gold import (
    EXCLUSIONS,
    NO_STRUCTURE,
    NOT_TAKEN,
    PURPOSES,
    kept,
)

CITATIONS_TSV = "act-sdp-test.tsv"
FIRST_PAGES = "citing-first-pages"
LICENSE = "LICENSE-CORE-MIT.txt"
AUTHOR_TAG = "#AUTHOR_TAG"
# the citation set's classes, in the order of `citation_class_label`
CLASS_NAMES = dict(enumerate(PURPOSES))
# cited papers have no corpus id in the set: a case's cited_id is this plus the citation's number
CITED_ID_BASE = 900_000_000
EXCLUSION_ORDER = (*EXCLUSIONS, NO_STRUCTURE)
PASSING = ("observed_analogy", "potential_analogy")
RULES: dict[str, str] = {
    "observed_analogy": "P2 decide: grounded mappings and a relation, and the citing text shows "
    "q building on what d contributes",
    "potential_analogy": "P2 decide: grounded mappings and a relation, a concrete route to q's "
    "goal, no shown use",
    "same_problem": "P2 exclude first: d already works on q's problem",
    "background_only": "P2 exclude: d only frames q's story; nothing of d moves through a mapping",
    "tool_or_data_as_is": "P2 exclude: q runs d's tool, data or instrument unchanged",
    "terminology_only": "P2 exclude: borrowed words with no relation on both sides",
    "surface_similarity": "P2 exclude: the papers only look alike",
    "unsupported_possibility": "P2 exclude: a link the texts do not back",
    "off_goal_mapping": "P2 exclude: what the pairing carries does nothing for q's goal",
    "adoption_without_transfer": "P2 exclude: q takes something of d but carries no relation",
    NO_STRUCTURE: "P2 decide: nothing fires, yet no structure is shared either",
}


@dataclass(frozen=True)
class Citation:
    """One row of the citation set, with the citing paper's first-page texts."""

    unique_id: str
    core_id: str
    purpose: str
    q_title: str
    q_abstract: str | None
    d_title: str
    d_abstract: str
    d_first_author: str
    context: str


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def surname(authors: str) -> str:
    """The first author's surname from the set's JSON list ("Gary Charness" → "Charness")."""
    names = json.loads(authors) if authors.strip() else []
    return names[0].split()[-1] if names and names[0].split() else "Anonymous"


def shown_context(context: str, first_author: str) -> str:
    """The citing sentence as a build would send it (the module doc says why this name)."""
    return context.replace(AUTHOR_TAG, first_author).strip()


def read_citations(folder: Path) -> dict[str, Citation]:
    """Every citation of the set, by unique_id, with q's title and abstract from its pages."""
    with (folder / CITATIONS_TSV).open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    pages: dict[str, tuple[str, str | None]] = {}
    for core_id in {r["core_id"] for r in rows}:
        path = folder / FIRST_PAGES / f"{core_id}.txt"
        recorded = next(r["citing_title"] for r in rows if r["core_id"] == core_id)
        if path.is_file():
            page = read_first_page_file(path, recorded)
            pages[core_id] = (page.title, page.abstract)
        else:
            pages[core_id] = (recorded.strip(), None)
    return {
        r["unique_id"]: Citation(
            unique_id=r["unique_id"],
            core_id=r["core_id"],
            purpose=CLASS_NAMES[int(r["citation_class_label"])],
            q_title=pages[r["core_id"]][0],
            q_abstract=pages[r["core_id"]][1],
            d_title=r["cited_title"].strip(),
            d_abstract=r["cited_abstract"].strip(),
            d_first_author=surname(r["cited_author"]),
            context=r["citation_context"],
        )
        for r in rows
    }


def citing_abstracts(citations: Iterable[Citation]) -> dict[str, dict[str, str | None]]:
    """{core_id: {title, abstract}} of every citing paper with first pages."""
    return {
        c.core_id: {"title": c.q_title, "abstract": c.q_abstract}
        for c in sorted(citations, key=lambda c: c.core_id)
    }


# -- analogy ---------------------------------------------------------------------------------------


def _differ(reading: dict[str, Any]) -> bool:
    return reading["q_topic"].strip().lower() != reading["d_topic"].strip().lower()


def _reading(who: str, r: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"reader": who, "expected": {"decision": r["decision"]}, "why": r["why"]}
    if r["decision"] == "not_analogy":
        out["exclusion"] = r["exclusion"] or NO_STRUCTURE
    return out


def final_analogy_label(
    first: dict[str, Any], second: dict[str, Any], hand: dict[str, Any] | None, purpose: str
) -> tuple[str, str | None, str | None]:
    """(decision, exclusion, adjudication line) of a case from its two readings (module doc)."""
    a, b = _reading("first", first), _reading("second", second)
    same = (a["expected"], a.get("exclusion")) == (b["expected"], b.get("exclusion"))
    decision = a["expected"]["decision"]
    needs_hand = not same and not (
        decision == "not_analogy" and b["expected"]["decision"] == "not_analogy"
    )
    if same and decision == "observed_analogy" and purpose in NOT_TAKEN:
        needs_hand = True
    if needs_hand:
        if hand is None:
            raise ValueError(
                f"{first['unique_id']}: the readings differ ({a['expected']['decision']} / "
                f"{b['expected']['decision']}) or pass a {purpose} citation: "
                "adjudications.jsonl needs a line for it"
            )
        return hand["decision"], hand.get("exclusion"), hand["adjudication"]
    if same:
        return decision, a.get("exclusion"), None
    first_x, second_x = a["exclusion"], b["exclusion"]
    winner = min(first_x, second_x, key=EXCLUSION_ORDER.index)
    loser = second_x if winner == first_x else first_x
    return (
        "not_analogy",
        winner,
        f"Both readings reject; {winner} comes before {loser} in the method's order, so it "
        "decides.",
    )


def analogy_cases(
    citations: dict[str, Citation],
    first: dict[str, dict[str, Any]],
    second: dict[str, dict[str, Any]],
    hand: dict[str, dict[str, Any]],
    topic_hand: dict[str, dict[str, Any]],
) -> tuple[list[dict[str, Any]], Counter[str]]:
    """The real analogy cases, and why the other rows were left out (counts)."""
    cases: list[dict[str, Any]] = []
    left: Counter[str] = Counter()
    for uid in sorted(first, key=lambda u: int(u.removeprefix("CCT"))):
        f, s, c = first[uid], second.get(uid), citations[uid]
        if s is None:
            left["one reading only"] += 1
            continue
        if not (f["abstract_ok"] and s["abstract_ok"]):
            left["cited abstract not the cited work's"] += 1
            continue
        if not c.q_abstract:
            left["no citing abstract on the first pages"] += 1
            continue
        topics = _topics(f, s, topic_hand.get(uid))
        if topics is None:
            left["topics not different"] += 1
            continue
        try:
            decision, exclusion, adjudication = final_analogy_label(f, s, hand.get(uid), c.purpose)
        except ValueError as exc:
            left[f"needs adjudication: {exc}"] += 1
            continue
        case: dict[str, Any] = {
            "id": f"analogy-{uid.lower()}",
            "covers": _covers(decision, exclusion, c.purpose, topics),
            "rule": RULES[exclusion or decision],
            "why": (hand.get(uid) or {}).get("why") or f["why"],
            "synthetic": False,
            "sources": {"unique_id": uid, "core_id": c.core_id},
            "purpose": c.purpose,
            "topics": topics,
            "citing_sentence": "real",
            "input": {
                "base_id": int(c.core_id),
                "cited_id": CITED_ID_BASE + int(uid.removeprefix("CCT")),
                "q_title": c.q_title,
                "q_abstract": c.q_abstract,
                "q_topic": topics["q_topic"],
                "d_title": c.d_title,
                "d_abstract": c.d_abstract,
                "d_topic": topics["d_topic"],
                "contexts": [shown_context(c.context, c.d_first_author)],
            },
            "expected": {"decision": decision},
            "readings": [_reading("first", f), _reading("second", s)],
        }
        if exclusion is not None:
            case["exclusion"] = exclusion
        if adjudication is not None:
            case["adjudication"] = adjudication
        cases.append(case)
    return cases, left


def _topics(
    first: dict[str, Any], second: dict[str, Any], hand: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The case's recorded fields and topics: the first reader's when both readers gave the
    papers different topics, the adjudicated ones when the readers disagree on that; None when
    the papers share a topic."""
    if hand is not None:
        if not hand["keep"]:
            return None
        chosen = hand
    elif _differ(first) and _differ(second):
        chosen = first
    else:
        return None
    if not _differ(chosen):
        return None
    out: dict[str, Any] = {
        k: chosen[k].strip() for k in ("q_field", "q_topic", "d_field", "d_topic")
    }
    out["cross_field"] = out["q_field"] != out["d_field"]
    if hand is not None:
        out["adjudication"] = hand["why"]
    return out


def _covers(decision: str, exclusion: str | None, purpose: str, topics: dict[str, Any]) -> str:
    fields = "across fields" if topics["cross_field"] else "within one field"
    label = f"exclusion:{exclusion}" if exclusion else f"decision:{decision}"
    return f"{label}; a real citing sentence; {purpose.lower()} citation; {fields}"


# -- transfer and query review, written from the set by another reader -------------------------


MASK = "[CITATION]"


def written_cases(
    stage: str,
    first: Sequence[dict[str, Any]],
    second: dict[str, dict[str, Any]],
    hand: dict[str, dict[str, Any]],
    citations: dict[str, Citation],
) -> tuple[list[dict[str, Any]], Counter[str]]:
    """Cases authored from the citation set (first reading) with their blind second reading.
    Their author wrote the cited reference as `[CITATION]`: the query review reads sentences so
    masked in a build, but the verifier reads them as S2 gives them, so its cases get the cited
    first author's name there, as the analogy cases do."""
    cases: list[dict[str, Any]] = []
    left: Counter[str] = Counter()
    for line in first:
        other = second.get(line["id"])
        if other is None:
            left["no second reading"] += 1
            continue
        if line["q_topic"].strip().lower() == line["d_topic"].strip().lower():
            left["topics not different"] += 1
            continue
        given = dict(line["input"])
        if stage == stages.JUDGE_TRANSFER:
            name = citations[line["unique_id"]].d_first_author
            given["contexts"] = [c.replace(MASK, name) for c in given["contexts"]]
        case_id = line["id"]
        number = int(line["unique_id"].removeprefix("CCT"))
        topics = {k: line[k] for k in ("q_field", "q_topic", "d_field", "d_topic")}
        topics["cross_field"] = topics["q_field"] != topics["d_field"]
        ids = {"base_id": int(line["core_id"]), "cited_id": CITED_ID_BASE + number}
        expected, adjudication = line["expected"], None
        passes = line["expected"] in ({"verdict": "transfer"},)
        if other["expected"] != line["expected"] or (passes and line["purpose"] in NOT_TAKEN):
            chosen = hand.get(case_id)
            if chosen is None:
                left[
                    f"needs adjudication: {case_id}: the readings differ, or pass a "
                    f"{line['purpose']} citation"
                ] += 1
                continue
            expected, adjudication = chosen["expected"], chosen["adjudication"]
        case = {
            "id": case_id,
            "covers": line["covers"],
            "rule": line["rule"],
            "why": line["why"],
            "synthetic": False,
            "sources": {"unique_id": line["unique_id"], "core_id": line["core_id"]},
            "purpose": line["purpose"],
            "topics": topics,
            "citing_sentence": "real" if line["input"].get("contexts") else "none",
            "input": ids | given if stage == stages.JUDGE_TRANSFER else given,
            "expected": expected,
            "readings": [
                {"reader": "first", "expected": line["expected"], "why": line["why"]},
                {"reader": "second", "expected": other["expected"], "why": other["why"]},
            ],
        }
        if adjudication is not None:
            case["adjudication"] = adjudication
        cases.append(case)
    return cases, left


# -- merging with the shipped cases ----------------------------------------------------------------


def citing_sentence(stage: str, case: dict[str, Any]) -> dict[str, Any]:
    """A shipped case with its `citing_sentence` field (stages that read citing sentences)."""
    if stage not in (stages.JUDGE_ANALOGY, stages.JUDGE_TRANSFER, stages.WRITE_QUERIES):
        return case
    if "citing_sentence" in case:
        return case
    contexts = case["input"].get("contexts") or []
    kind = "none" if not contexts else ("invented" if case["synthetic"] else "real")
    return {**case, "citing_sentence": kind}


def trimmed(
    shipped: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]], stage: str, share: float
) -> list[dict[str, Any]]:
    """The shipped cases kept beside `new`: those with citing sentences, and of those without
    (a marked minority, kept for the dry-run profile) as many as leave `share` of all cases with
    a real citing sentence, taken in turn from each label so the mix stays."""
    if not new:
        return list(shipped)  # nothing real to make room for
    real = sum(c["citing_sentence"] == "real" for c in [*new, *shipped])
    with_text = [c for c in shipped if c["citing_sentence"] != "none"]
    without = [c for c in shipped if c["citing_sentence"] == "none"]
    room = int(real / share) - len(new) - len(with_text)
    if room >= len(without):
        return list(shipped)
    by_label: dict[Any, list[dict[str, Any]]] = {}
    for c in without:
        by_label.setdefault(kept(stage, _label(stage, c)), []).append(c)
    picked: list[dict[str, Any]] = []
    queues = list(by_label.values())
    while len(picked) < max(room, 0) and any(queues):
        for q in queues:
            if q and len(picked) < room:
                picked.append(q.pop(0))
    keep = {c["id"] for c in [*with_text, *picked]}
    return [c for c in shipped if c["id"] in keep]


def _label(stage: str, case: dict[str, Any]) -> Any:
    e = case["expected"]
    if stage == stages.JUDGE_ANALOGY:
        return e["decision"]
    if stage == stages.JUDGE_TRANSFER:
        return "transfer" if e["verdict"] == "transfer" else e["reject_reason"]
    return "accept" if e.get("accept") else "reject"


# cases shipped before B.2 counted a resource taken as it is as a contribution (transfer.v4):
# their reject "background_only" no longer fits the method, so they leave the gold
NO_LONGER_FIT: dict[str, str] = {
    "transfer-r003": "d's simulation method used as is: a contribution under B.2",
    "transfer-r016": "d's polymer used as a material: a resource under B.2",
    "transfer-r017": "d's modelling software used as is: a resource under B.2",
    "transfer-r021": "d's measurement method applied unchanged: a measure under B.2",
    "transfer-r034": "d's measurement tool used as is: a measure under B.2",
}


def write_jsonl(path: Path, cases: Sequence[dict[str, Any]]) -> None:
    text = "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in cases)
    path.write_text(text, encoding="utf-8")


def _by(lines: Iterable[dict[str, Any]], key: str) -> dict[str, dict[str, Any]]:
    return {line[key]: line for line in lines}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--labels", type=Path, required=True)
    parser.add_argument("--citations", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True, help="the gold folder to rewrite")
    parser.add_argument("--share", type=float, default=0.6, help="real citing sentences, at least")
    args = parser.parse_args(argv)
    labels = args.labels
    citations = read_citations(args.citations)
    (labels / "citing-abstracts.json").write_text(
        json.dumps(citing_abstracts(citations.values()), ensure_ascii=False, indent=1) + "\n"
    )
    hand = _by(read_jsonl(labels / "adjudications.jsonl"), "key")
    topic_hand = _by(read_jsonl(labels / "topic-adjudications.jsonl"), "unique_id")
    first = _by(
        read_jsonl(labels / "analogy-first-A.jsonl") + read_jsonl(labels / "analogy-first-B.jsonl"),
        "unique_id",
    )
    second = _by(
        read_jsonl(labels / "analogy-second-A.jsonl")
        + read_jsonl(labels / "analogy-second-B.jsonl"),
        "unique_id",
    )
    new = {stages.JUDGE_ANALOGY: analogy_cases(citations, first, second, hand, topic_hand)}
    for stage, name in ((stages.JUDGE_TRANSFER, "transfer"), (stages.WRITE_QUERIES, "queries")):
        new[stage] = written_cases(
            stage,
            read_jsonl(labels / f"{name}-first.jsonl"),
            _by(read_jsonl(labels / f"{name}-second.jsonl"), "id"),
            hand,
            citations,
        )
    missing = [k for _, left in new.values() for k in left if k.startswith("needs adjudication")]
    if missing:
        raise SystemExit("\n".join(["adjudications.jsonl lacks:", *missing]))
    for stage, (cases, left) in new.items():
        path = args.out / f"{stage}.jsonl"
        shipped = [
            citing_sentence(stage, c)
            for c in read_jsonl(path)
            if "sources" not in c or not isinstance(c["sources"], dict)
        ]
        shipped = [c for c in shipped if c["id"] not in NO_LONGER_FIT]
        kept_cases = trimmed(shipped, cases, stage, args.share)
        write_jsonl(path, [*cases, *kept_cases])
        print(
            f"{stage}: {len(cases)} real cases from the citation set "
            f"(left out: {dict(left) or 'none'}), {len(kept_cases)} of {len(shipped)} shipped kept"
        )
    for stage in (stages.DEDUP, stages.STRONGEST, stages.SCORE_POSITIVES, stages.JUDGE_NEGATIVES):
        path = args.out / f"{stage}.jsonl"
        write_jsonl(path, [citing_sentence(stage, c) for c in read_jsonl(path)])
    license_text = (args.citations / LICENSE).read_text(encoding="utf-8")
    (args.out / LICENSE).write_text(license_text, encoding="utf-8")


if __name__ == "__main__":
    main()
