"""Writing the query of a verified pair: extract the problem → rewrite as "How to …" → review.

A review failure (the reviewer's booleans or the mechanical rules) regenerates both steps with
the objection, at most twice. The cache keeps the last attempt as written and reviewed; which
query is kept — or the pair dropped, with the objections as its reason — is decided after every
read (`QueryWriter.derive`), so a changed rule applies to old answers.
"""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa
from pydantic import Field

from cpr_ray.llm import prompts
from cpr_ray.llm.answers import _Answer
from cpr_ray.llm.client import LLMClient, Status, Usage
from cpr_ray.llm.runner import LLMTask
from cpr_ray.queries.judges import format_contexts


class ProblemStatement(_Answer):
    problem: str = Field(
        max_length=500, description="1-2 sentences: the difficulty q faced, not its method."
    )


MAX_QUERY_WORDS = 45
QUERY_CHARS = 320  # about 45 words of seven characters
WORD_CHARS = 32  # longer than any word a query needs

# The form of a query is part of the contract, so the schema itself constrains it where the
# endpoint supports patterns (llama.cpp grammars, vLLM structured output): one lower-case "How to"
# question of at most MAX_QUERY_WORDS single-spaced words, ending in its only "?", with no
# brackets, capitals or full stops, so no citation marker ("[3]", "(Smith et al.") can be written.
# Grammars enforce the pattern, not maxLength (llama.cpp ignores it beside a pattern), so the word
# bound lives in the pattern. The rules below hold either way.
QUERY_PATTERN = rf"^[Hh]ow to(?: [a-z0-9,;:'()/-]{{1,{WORD_CHARS}}}){{1,{MAX_QUERY_WORDS - 2}}}\?$"


class WrittenQuery(_Answer):
    query: str = Field(pattern=QUERY_PATTERN, max_length=QUERY_CHARS)


class QueryReview(_Answer):
    problem_only: bool
    grounded: bool
    well_formed: bool
    issue: str | None = Field(max_length=300)


META_WORDS = ("analogy", "analogous", "mapping", "mappings", "cited", "citation", "paper")
METHOD_PHRASES = (
    "by using",
    "by applying",
    "by means of",
    "through the use of",
    "with the help of",
    "via ",
)


def query_rule_violations(query: str) -> list[str]:
    """The mechanical rules every query must pass, whatever the reviewer said."""
    problems = []
    text = query.strip()
    if not text.startswith(("How to ", "how to ")):
        problems.append('must start with "How to"')
    if re.search(r"\[\s*(citation|\d+)[^\]]*\]|\(\s*[A-Z][a-z]+ et al\.", text, re.I):
        problems.append("contains a citation marker")
    if any(tok.isupper() and len(tok) > 1 for tok in re.findall(r"[A-Za-z]+", text)):
        problems.append("contains an upper-case token (acronym or variable)")
    words = re.findall(r"[a-z']+", text.lower())
    meta = sorted({w for w in words if w in META_WORDS})
    if meta:
        problems.append(f"contains meta-language: {', '.join(meta)}")
    low = text.lower()
    method = [p.strip() for p in METHOD_PHRASES if p in low]
    if method:
        problems.append(f"names a method: {', '.join(method)}")
    if len(text.split()) > MAX_QUERY_WORDS:
        problems.append(f"longer than {MAX_QUERY_WORDS} words")
    return problems


def query_objections(
    query: str, *, problem_only: bool, grounded: bool, well_formed: bool, issue: str | None
) -> list[str]:
    """Why a written query is not accepted (empty: accepted): the reviewer's booleans, then the
    mechanical rules. The writer regenerates with these; afterwards they decide the kept query."""
    review_ok = problem_only and grounded and well_formed
    reasons = [] if review_ok else [issue or "the reviewer rejected it"]
    return reasons + query_rule_violations(query)


MAX_REGENERATIONS = 2
PLAIN_PROSE = "Write plain prose with no symbols, formulas or variables."

# In-text markers: numeric ([12], [3-5, 8]) and author-year ((Smith et al., 2010; Li 2019)).
_MARKERS = re.compile(
    r"\[\s*\d+(?:\s*[-–,;]\s*\d+)*\s*\]"
    r"|\((?:[A-Z][A-Za-z'\-]+(?: et al\.?| and [A-Z][A-Za-z'\-]+)?,? \d{4}[a-z]?;?\s*)+\)"
)


def mask_citations(sentence: str) -> str:
    """Replace citation markers with [CITATION]. S2 does not say which marker is d's, so every
    marker is masked: the extractor must not learn d's identity from the sentence."""
    return _MARKERS.sub("[CITATION]", sentence)


def taken_from_d(transfer_path: str | None) -> str:
    """The first part of the transfer path: what q took from d (left out of the problem)."""
    if not transfer_path:
        return "(not stated)"
    return re.split(r"(?<=[.;])\s", transfer_path.strip(), maxsplit=1)[0][:500]


class QueryWriter(LLMTask):
    stage = "write-queries"
    prompts = (prompts.load("extract"), prompts.load("rewrite"), prompts.load("review"))
    key_columns = (
        "base_id",
        "cited_id",
        "q_title",
        "q_abstract",
        "contexts",
        "transfer_path",
        "d_fields",
    )
    output_schema = pa.schema(
        [
            ("problem", pa.string()),
            ("written_query", pa.string()),
            ("query_words", pa.int32()),
            ("review_problem_only", pa.bool_()),
            ("review_grounded", pa.bool_()),
            ("review_well_formed", pa.bool_()),
            ("review_issue", pa.string()),
            ("regenerations", pa.int8()),
        ]
    )

    def derive(self, table: pa.Table) -> pa.Table:
        """`query` (the written one, where accepted) and `drop_reason` (the objections, where
        not), from the last attempt of every `ok` row. A loop over rows: the rules are regexes
        over one query, and there is one row per verified pair."""
        queries, reasons = [], []
        for row in table.select(
            [
                "status",
                "written_query",
                "review_problem_only",
                "review_grounded",
                "review_well_formed",
                "review_issue",
            ]
        ).to_pylist():
            objections = (
                query_objections(
                    row["written_query"],
                    problem_only=row["review_problem_only"],
                    grounded=row["review_grounded"],
                    well_formed=row["review_well_formed"],
                    issue=row["review_issue"],
                )
                if row["status"] == "ok"
                else None
            )
            queries.append(row["written_query"] if objections == [] else None)
            reasons.append("; ".join(objections) if objections else None)
        return table.append_column("query", pa.array(queries, pa.string())).append_column(
            "drop_reason", pa.array(reasons, pa.string())
        )

    async def run(
        self, client: LLMClient, row: dict[str, Any], usage: Usage
    ) -> tuple[dict[str, Any], Status, str | None]:
        extract, rewrite, review = self.prompts
        contexts = format_contexts([mask_citations(c) for c in row["contexts"] or []])
        objection, extra = "", ""
        out: dict[str, Any] = self.empty_output()
        for attempt in range(MAX_REGENERATIONS + 1):
            p = await client.ask(
                self.stage,
                extract.render(
                    q_title=row["q_title"] or "",
                    q_abstract=row["q_abstract"] or "",
                    contexts=contexts,
                    taken=taken_from_d(row["transfer_path"]),
                    extra=extra,
                ),
                ProblemStatement,
                usage=usage,
            )
            if p.value is None:
                return out, p.status, f"problem extraction: {p.error}"
            q = await client.ask(
                self.stage,
                rewrite.render(
                    problem=p.value.problem, d_fields=row["d_fields"] or "", objection=objection
                ),
                WrittenQuery,
                usage=usage,
            )
            if q.value is None:
                return out, q.status, f"query rewrite: {q.error}"
            r = await client.ask(
                self.stage,
                review.render(problem=p.value.problem, query=q.value.query),
                QueryReview,
                usage=usage,
            )
            if r.value is None:
                return out, r.status, f"query review: {r.error}"
            query = q.value.query.strip()
            out = {
                "problem": p.value.problem,
                "written_query": query,
                "query_words": len(query.split()),
                "review_problem_only": r.value.problem_only,
                "review_grounded": r.value.grounded,
                "review_well_formed": r.value.well_formed,
                "review_issue": r.value.issue,
                "regenerations": attempt,
            }
            objections = query_objections(
                query,
                problem_only=r.value.problem_only,
                grounded=r.value.grounded,
                well_formed=r.value.well_formed,
                issue=r.value.issue,
            )
            if not objections:
                break
            objection = f"The previous question was rejected: {'; '.join(objections)}. Fix that."
            extra = PLAIN_PROSE
        return out, "ok", None
