"""Deduplicating the queries of one base paper (App. B.4).

Every two queries of one base paper are put side by side, and the model says whether whatever
paper settles one would also settle the other; same-problem answers link queries into groups
(transitively), and each group of two or more keeps the cited paper with the strongest
analogy, as a model judges it from the texts (`StrongestAnalogyJudge`: one call per group).
Where that answer is missing, invalid or names no candidate, a ranking read off the first
judgment decides instead (`strength`): observed before potential, a transfer of the cited
paper's own method, formulation or finding before other kinds, then more shared relations,
then more mappings (ties: lower cited id).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterator, Mapping
from itertools import combinations
from typing import Any, Literal

import pyarrow as pa
from pydantic import Field, create_model

from cpr_ray.llm import prompts
from cpr_ray.llm.answers import _Answer
from cpr_ray.llm.client import LLMClient, Status, Usage
from cpr_ray.llm.task import LLMTask
from cpr_ray.queries.judges import format_contexts, format_mappings
from cpr_ray.queries.writing import mask_citations
from cpr_ray.stages import DEDUP


class SameProblem(_Answer):
    same_problem: bool = Field(description="Would a paper that answers one answer the other?")
    reason: str = Field(max_length=300)


# a group larger than this shows the model its MAX_CANDIDATES strongest by `strength`: every
# candidate brings an abstract, and a prompt must stay within a judge's context
MAX_CANDIDATES = 8


class StrongestAnalogy(_Answer):
    """Which candidate of a same-problem group has the strongest analogy (1-based, as the prompt
    numbers them). The bound here is the largest group; `strongest_answer(n)` narrows it to a
    group's size, so a grammar-constrained model cannot name a candidate that is not there."""

    index: int = Field(
        ge=1, le=MAX_CANDIDATES, description="The number of the chosen candidate, from 1."
    )
    reason: str = Field(max_length=300, description="Why its analogy is the strongest.")


@functools.cache
def strongest_answer(n: int) -> type[StrongestAnalogy]:
    """The answer contract for a group of `n` candidates: `index` bounded by 1..n. One class per
    size, made once (the request's schema is built once per class); it keeps the base's name,
    which is the schema name the endpoint sees."""
    if not 2 <= n <= MAX_CANDIDATES:
        raise ValueError(f"a group has 2 to {MAX_CANDIDATES} candidates, not {n}")
    return create_model(
        StrongestAnalogy.__name__,
        __base__=StrongestAnalogy,
        __module__=__name__,
        index=(int, Field(ge=1, le=n, description=f"The number of the chosen candidate, 1-{n}.")),
    )


CORE_TRANSFER = ("method", "problem_formulation", "finding_or_evidence")
ChosenBy = Literal["alone", "model", "rule"]


def query_pairs(queries: pa.Table) -> pa.Table:
    """All unordered pairs of queries sharing a base paper (input: base_id, cited_id, query)."""
    by_base: dict[int, list[tuple[int, str]]] = {}
    for row in queries.select(["base_id", "cited_id", "query"]).to_pylist():
        by_base.setdefault(row["base_id"], []).append((row["cited_id"], row["query"]))
    rows = [
        {"base_id": base, "cited_a": a, "query_a": qa, "cited_b": b, "query_b": qb}
        for base, items in sorted(by_base.items())
        for (a, qa), (b, qb) in combinations(sorted(items), 2)
    ]
    schema = pa.schema(
        [
            ("base_id", pa.int64()),
            ("cited_a", pa.int64()),
            ("query_a", pa.string()),
            ("cited_b", pa.int64()),
            ("query_b", pa.string()),
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)


def strength(row: dict[str, Any]) -> tuple:
    """Sort key, strongest analogy first: the tie-break when the model's choice is missing."""
    return (
        0 if row["decision"] == "observed_analogy" else 1,
        0 if row["transfer_type"] in CORE_TRANSFER else 1,
        -len(row["shared_relations"] or []),
        -len(row["object_mappings"] or []),
        row["cited_id"],
    )


def groups(members: list[int], same: list[tuple[int, int]]) -> list[list[int]]:
    """Connected components of the same-problem graph (union-find), each sorted."""
    parent = {m: m for m in members}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in same:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    out: dict[int, list[int]] = {}
    for m in members:
        out.setdefault(find(m), []).append(m)
    return sorted(sorted(g) for g in out.values())


def _groups_by_base(
    rows: list[dict[str, Any]], same_pairs: list[tuple[int, int, int]]
) -> Iterator[tuple[int, int, list[dict[str, Any]]]]:
    """(base_id, group id — its smallest cited id —, member rows) for every same-problem group."""
    by_base: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_base.setdefault(row["base_id"], []).append(row)
    links: dict[int, list[tuple[int, int]]] = {}  # one pass: a scan per base is quadratic
    for base, a, b in same_pairs:
        links.setdefault(base, []).append((a, b))
    for base, items in by_base.items():
        for group in groups([r["cited_id"] for r in items], links.get(base, [])):
            members = set(group)
            yield base, group[0], [r for r in items if r["cited_id"] in members]


CANDIDATE = pa.struct(
    [
        ("cited_id", pa.int64()),
        ("d_title", pa.string()),
        ("d_abstract", pa.string()),
        ("contexts", pa.list_(pa.string())),
        ("mappings", pa.string()),
    ]
)
STRONGEST_REQUESTS = pa.schema(
    [
        ("base_id", pa.int64()),
        ("dedup_group", pa.int64()),
        ("q_title", pa.string()),
        ("q_abstract", pa.string()),
        ("candidates", pa.list_(CANDIDATE)),
    ]
)


def strongest_requests(queries: pa.Table, same_pairs: list[tuple[int, int, int]]) -> pa.Table:
    """One row per same-problem group of two or more: what the strongest-analogy judge reads.

    Candidates are the group's members (its MAX_CANDIDATES strongest by `strength` if larger)
    in cited-id order, so their order in the prompt says nothing about the code's ranking. The
    input needs base_id, cited_id, q_title, q_abstract, d_title, d_abstract, contexts,
    object_mappings and the `strength` columns."""
    rows = []
    for base, group, members in _groups_by_base(queries.to_pylist(), same_pairs):
        if len(members) < 2:
            continue
        shortlist = sorted(sorted(members, key=strength)[:MAX_CANDIDATES], key=_cited)
        rows.append(
            {
                "base_id": base,
                "dedup_group": group,
                "q_title": members[0]["q_title"],
                "q_abstract": members[0]["q_abstract"],
                "candidates": [
                    {
                        "cited_id": m["cited_id"],
                        "d_title": m["d_title"],
                        "d_abstract": m["d_abstract"],
                        "contexts": m["contexts"],
                        "mappings": format_mappings(m["object_mappings"]),
                    }
                    for m in shortlist
                ],
            }
        )
    return pa.Table.from_pylist(rows, schema=STRONGEST_REQUESTS)


def _cited(row: dict[str, Any]) -> int:
    return row["cited_id"]


def model_choice(index: int | None, candidates: list[dict[str, Any]] | None) -> int | None:
    """The cited id the model chose, or None where its index names no candidate: an answer is
    checked after arrival too, since not every endpoint enforces the schema's bounds."""
    if index is None or not candidates or not 1 <= index <= len(candidates):
        return None
    return candidates[index - 1]["cited_id"]


def model_choices(judged: pa.Table) -> dict[tuple[int, int], int]:
    """(base_id, dedup_group) → the cited id the model chose, for the groups where it chose one
    (the output of `StrongestAnalogyJudge`, after `derive`)."""
    return {
        (r["base_id"], r["dedup_group"]): r["model_choice"]
        for r in judged.select(["base_id", "dedup_group", "model_choice"]).to_pylist()
        if r["model_choice"] is not None
    }


def keep_strongest(
    queries: pa.Table,
    same_pairs: list[tuple[int, int, int]],
    choices: Mapping[tuple[int, int], int] | None = None,
) -> pa.Table:
    """Per base paper, one query per same-problem group: the strongest analogy.

    `same_pairs` are (base_id, cited_a, cited_b) judged the same problem; `choices` the model's
    pick per (base_id, group), where it made a valid one. A group without a pick, or whose pick
    is not a member, keeps the first by `strength`. Adds `dedup_group` (the group's smallest
    cited id), `kept`, and `dedup_chosen_by` ("alone": a group of one; "model"; "rule").
    """
    choices = choices or {}
    rows = queries.to_pylist()
    keep: set[tuple[int, int]] = set()
    group_of: dict[tuple[int, int], int] = {}
    chosen_by: dict[tuple[int, int], ChosenBy] = {}
    for base, group, members in _groups_by_base(rows, same_pairs):
        pick = choices.get((base, group))
        by: ChosenBy
        if len(members) == 1:
            best, by = members[0]["cited_id"], "alone"
        elif pick in {m["cited_id"] for m in members}:
            best, by = pick, "model"
        else:
            best, by = min(members, key=strength)["cited_id"], "rule"
        keep.add((base, best))
        for r in members:
            group_of[(base, r["cited_id"])] = group
            chosen_by[(base, r["cited_id"])] = by
    ids = [(r["base_id"], r["cited_id"]) for r in rows]
    return (
        queries.append_column("dedup_group", pa.array([group_of[i] for i in ids], pa.int64()))
        .append_column("kept", pa.array([i in keep for i in ids], pa.bool_()))
        .append_column("dedup_chosen_by", pa.array([chosen_by[i] for i in ids], pa.string()))
    )


class SameProblemJudge(LLMTask):
    stage = DEDUP
    prompts = (prompts.load("dedup", "v3"),)
    key_columns = ("query_a", "query_b")
    prefix_columns = ("query_a",)
    output_schema = pa.schema([("same_problem", pa.bool_()), ("same_reason", pa.string())])

    async def run(
        self, client: LLMClient, row: dict[str, Any], usage: Usage
    ) -> tuple[dict[str, Any], Status, str | None]:
        out = await client.ask(
            self.stage,
            self.prompts[0].render(query_a=row["query_a"], query_b=row["query_b"]),
            SameProblem,
            usage=usage,
        )
        if out.value is None:
            return self.empty_output(), out.status, out.error
        return {"same_problem": out.value.same_problem, "same_reason": out.value.reason}, "ok", None

    @staticmethod
    def gold_label(row: dict[str, Any]) -> Any:
        same = row.get("same_problem")
        return None if same is None else ("same" if same else "different")


class StrongestAnalogyJudge(LLMTask):
    """Which cited paper of a same-problem group has the strongest analogy, one call per group
    (`strongest_requests`). Same stage as the same-problem judge (its model, pins and cache
    folder; the request keys differ by prompt and schema). `derive` adds `model_choice`, the
    chosen cited id where the answer names a candidate; `keep_strongest` falls back to the
    ranking where it does not."""

    stage = DEDUP
    prompts = (prompts.load("strongest"), prompts.load("strongest_candidate"))
    key_columns = ("base_id", "q_title", "q_abstract", "candidates")
    prefix_columns = ("q_title", "q_abstract")
    output_schema = pa.schema([("strongest_index", pa.int32()), ("strongest_reason", pa.string())])

    def derive(self, table: pa.Table) -> pa.Table:
        picks = [
            model_choice(r["strongest_index"], r["candidates"]) if r["status"] == "ok" else None
            for r in table.select(["status", "strongest_index", "candidates"]).to_pylist()
        ]
        return table.append_column("model_choice", pa.array(picks, pa.int64()))

    @staticmethod
    def gold_label(row: dict[str, Any]) -> Any:
        """The index only where it names a candidate (`model_choice`), as a build reads it."""
        return row.get("strongest_index") if row.get("model_choice") is not None else None

    def render(self, row: dict[str, Any]) -> str:
        """The prompt: the citing paper, then each candidate through the candidate template.
        Every text field is rendered (and bounded) on its own, so a long group is not cut at
        one field's limit."""
        frame, candidate = self.prompts
        blocks = "\n".join(
            candidate.render(
                number=str(i),
                d_title=c["d_title"] or "",
                d_abstract=c["d_abstract"] or "",
                contexts=format_contexts([mask_citations(s) for s in c["contexts"] or []]),
                mappings=c["mappings"] or "(none recorded)",
            )
            for i, c in enumerate(row["candidates"], 1)
        )
        slot = f"candidates-{uuid.uuid4().hex}"  # the frame's own fields are filled first
        text = frame.render(
            q_title=row["q_title"] or "",
            q_abstract=row["q_abstract"] or "",
            count=str(len(row["candidates"])),
            candidates=slot,
        )
        return text.replace(slot, blocks, 1)

    async def run(
        self, client: LLMClient, row: dict[str, Any], usage: Usage
    ) -> tuple[dict[str, Any], Status, str | None]:
        answer = strongest_answer(len(row["candidates"]))
        out = await client.ask(self.stage, self.render(row), answer, usage=usage)
        if out.value is None:
            return self.empty_output(), out.status, out.error
        return (
            {"strongest_index": out.value.index, "strongest_reason": out.value.reason},
            "ok",
            None,
        )
