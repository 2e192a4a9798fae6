"""Deduplicating the queries of one base paper (App. B.4).

Queries written from the same base paper are compared pairwise ("would a paper that answers one
answer the other?"); same-problem answers link queries into groups (transitively), and each group
keeps the pair with the strongest analogy. Strength is read off the first judgment, strongest
first: observed before potential, a transfer of the cited paper's own method, formulation or
finding before other kinds, then more shared relations, then more mappings (ties: lower cited id).
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

import pyarrow as pa
from pydantic import Field

from cpr_ray.llm import prompts
from cpr_ray.llm.answers import _Answer
from cpr_ray.llm.client import LLMClient, Status, Usage
from cpr_ray.llm.runner import LLMTask


class SameProblem(_Answer):
    same_problem: bool = Field(description="Would a paper that answers one answer the other?")
    reason: str = Field(max_length=300)


CORE_TRANSFER = ("method", "problem_formulation", "finding_or_evidence")


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
    """Sort key, strongest analogy first."""
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


def keep_strongest(queries: pa.Table, same_pairs: list[tuple[int, int, int]]) -> pa.Table:
    """Per base paper, one query per same-problem group: the strongest analogy.

    `same_pairs` are (base_id, cited_a, cited_b) judged the same problem. Adds `dedup_group` (the
    group's smallest cited id) and `kept`.
    """
    rows = queries.to_pylist()
    by_base: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_base.setdefault(row["base_id"], []).append(row)
    keep: set[tuple[int, int]] = set()
    group_of: dict[tuple[int, int], int] = {}
    for base, items in by_base.items():
        links = [(a, b) for b0, a, b in same_pairs if b0 == base]
        for group in groups([r["cited_id"] for r in items], links):
            members = [r for r in items if r["cited_id"] in group]
            best = min(members, key=strength)
            keep.add((base, best["cited_id"]))
            for r in members:
                group_of[(base, r["cited_id"])] = group[0]
    ids = [(r["base_id"], r["cited_id"]) for r in rows]
    return queries.append_column(
        "dedup_group", pa.array([group_of[i] for i in ids], pa.int64())
    ).append_column("kept", pa.array([i in keep for i in ids], pa.bool_()))


class SameProblemJudge(LLMTask):
    stage = "dedup"
    prompts = (prompts.load("dedup"),)
    key_columns = ("query_a", "query_b")
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
