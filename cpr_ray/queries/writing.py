"""Writing the query of a verified pair: extract the problem → rewrite as "How to …" → review.

A failure — the reviewer's booleans, the mechanical rules, or a rewrite the answer schema
refused — regenerates both steps with the objection, at most twice: the extraction sees its
earlier statement and the objection, the rewrite its earlier question and the objection. The
cache keeps the last attempt as written and reviewed; which query is kept — or the pair dropped,
with the objections as its reason — is decided after every read (`QueryWriter.derive`), so a
changed rule applies to old answers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
from pydantic import Field

from cpr_ray.llm import prompts
from cpr_ray.llm.answers import _Answer
from cpr_ray.llm.client import LLMClient, Outcome, Status, Usage
from cpr_ray.llm.task import LLMTask
from cpr_ray.queries.judges import format_contexts
from cpr_ray.stages import WRITE_QUERIES


class ProblemStatement(_Answer):
    problem: str = Field(
        max_length=500, description="1-2 sentences: the difficulty q faced, not its method."
    )


MAX_QUERY_WORDS = 45
QUERY_CHARS = 320  # about 45 words of seven characters
WORD_CHARS = 32  # longer than any word a query needs
QUERY_WORD_CHARS = "a-z0-9,;:'()/-"  # what a word of a query may hold (the pattern's class)

# The form of a query is part of the contract, so the schema itself constrains it where the
# endpoint supports patterns (llama.cpp grammars, vLLM structured output): one lower-case "How to"
# question of at most MAX_QUERY_WORDS single-spaced words, ending in its only "?", with no
# brackets, capitals or full stops, so no citation marker ("[3]", "(Smith et al.") can be written.
# Grammars enforce the pattern, not maxLength (llama.cpp ignores it beside a pattern), so the word
# bound lives in the pattern. The rules below hold either way.
QUERY_PATTERN = (
    rf"^[Hh]ow to(?: [{QUERY_WORD_CHARS}]{{1,{WORD_CHARS}}}){{1,{MAX_QUERY_WORDS - 2}}}\?$"
)


class WrittenQuery(_Answer):
    query: str = Field(pattern=QUERY_PATTERN, max_length=QUERY_CHARS)


class QueryReview(_Answer):
    problem_only: bool
    grounded: bool
    well_formed: bool
    issue: str | None = Field(max_length=300)


# -- citation markers ----------------------------------------------------------------------------

_SUP = "⁰¹²³⁴⁵⁶⁷⁸⁹"
_DASHES = "\\-‐‑‒–—"
_NAME = (
    r"(?:(?:van|von|de|der|den|da|di|du|del|la|le)\s+)*"  # particles: van der Berg
    r"[A-ZÀ-ÖØ-Þ][^\W\d_]*(?:['’\-][^\W\d_]+)*"  # Smith, O'Neil, Smith-Jones, Müller
)
_AUTHORS = rf"{_NAME}(?:\s+et\s+al\.?|\s+(?:and|&)\s+{_NAME})?"
_YEAR = r"(?:1[89]|20)\d{2}[a-z]?"
_YEARS = rf"{_YEAR}(?:\s*,\s*{_YEAR})*"
_ONE_CITATION = rf"{_AUTHORS},?\s+{_YEARS}"
_MARKERS = re.compile(
    # numeric lists and ranges: [12], [12–14], [3, 5-8]
    rf"(?P<numeric>\[\s*\d+(?:\s*[{_DASHES},;]\s*\d+)*\s*\])"
    # parenthetical author-year: (Smith et al., 2010; Li 2019), (e.g., Smith and Lee, 2010a)
    rf"|(?P<parenthetical>\(\s*(?:(?:e\.g\.|see|cf\.),?\s*)?{_ONE_CITATION}"
    rf"(?:\s*;\s*{_ONE_CITATION})*\s*\))"
    # narrative author-year: Smith et al. (2010), Smith and Lee (2010), Smith (2010a)
    rf"|(?P<narrative>{_AUTHORS}\s*\(\s*{_YEARS}\s*\))"
    # an author named with et al. and no year: still names the cited work
    rf"|(?P<etal>{_NAME}\s+et\s+al\.?)"
    # superscript numbers: ¹², ³⁻⁵, ¹,³
    rf"|(?P<sup>[{_SUP}]+(?:\s*[⁻,{_DASHES}]\s*[{_SUP}]+)*)"
    # caret numbers from converted text: ^12, ^3-5
    rf"|(?P<caret>\^\s*\d+(?:\s*[,{_DASHES}]\s*\d+)*)"
)


def _is_exponent(before: str, marker: str) -> bool:
    """Whether a superscript or caret number is a power, not a citation: it follows a number
    (10⁶, 10^6), a superscript sign (s⁻¹), or is a lone 2 or 3 on a short symbol (m², cm³, R²,
    x^2). Citation superscripts follow words and punctuation ("previously¹²", "models.³")."""
    if not before or before[-1].isdigit() or before[-1] in "⁻⁺":
        return True
    symbol = re.search(r"[^\W\d_]+$", before)
    lone = marker.lstrip("^ ") in ("2", "3", "²", "³")
    return lone and symbol is not None and len(symbol.group(0)) <= 2


def _mask(match: re.Match[str]) -> str:
    if match.group("sup") or match.group("caret"):
        if _is_exponent(match.string[: match.start()], match.group(0)):
            return match.group(0)
    return "[CITATION]"


def mask_citations(sentence: str) -> str:
    """Replace citation markers with [CITATION]. S2 does not say which marker is d's, so every
    marker is masked: the extractor must not learn d's identity from the sentence. Numbers and
    years in prose ("in 2010 we", "3 layers") and powers ("10 m²") are left as they are."""
    return _MARKERS.sub(_mask, sentence)


# -- the mechanical rules ------------------------------------------------------------------------

# words that are about the method's own machinery wherever they appear
META_WORDS = ("analogy", "analogies", "analogical", "mapping", "mappings")
# "paper", "cited", "citation" and "analogous" are ordinary words ("paper thickness", "citation
# counts", "analogous circuits"); only these phrases make them talk about the source papers
_CITATION_NOUNS = (
    r"counts?|impacts?|networks?|graphs?|rates?|analys[ie]s|data|index(?:es)?|indices|patterns?"
    r"|behaviou?rs?|practices?|metrics?|scores?|distributions?|dynamics"
)
META_PHRASES = (
    # the cited paper, analogous to the cited method, the citing work
    r"\bthe (?:cited|citing)(?: (?:paper|work|study|article|publication|method)s?)?\b",
    r"\b(?:cited|citing) (?:paper|work|study|article|publication)s?\b",
    r"\bthis (?:paper|article|study)\b",
    r"\bthe (?:other|original|source|base) (?:paper|article|study)\b",
    rf"\bthe citations?\b(?! (?:{_CITATION_NOUNS})\b)",  # the citation, not the citation counts
)
METHOD_PHRASES = (
    r"\bby (?:using|applying|employing|leveraging|means of)\b",
    r"\bthrough the use of\b",
    r"\bwith the help of\b",
    r"\bvia\b",
)
# citation markers a query could still hold: those masking finds, a masked one, "et al", and a
# parenthesised year in any case ("(smith, 2010)", "(2010)")
_QUERY_MARKERS = re.compile(
    r"\[\s*citation\s*\]|\bet al\b|\((?:[^()]*[\s,])?(?:1[89]|20)\d{2}[a-z]?\)", re.I
)


def _phrases(patterns: tuple[str, ...], text: str) -> list[str]:
    """The phrases of `text` the patterns match, each stretch of text named once (by the longest
    match: "the cited paper", not also "cited paper")."""
    found = sorted(
        (m for p in patterns for m in re.finditer(p, text)), key=lambda m: (m.start(), -m.end())
    )
    out, end = [], -1
    for m in found:
        if m.start() >= end:
            out.append(m.group(0))
        end = max(end, m.end())
    return out


def has_citation_marker(text: str) -> bool:
    """Whether a text holds a marker `mask_citations` would mask, or one a lower-case query
    could still hold."""
    masked = any(_mask(m) == "[CITATION]" for m in _MARKERS.finditer(text))
    return masked or _QUERY_MARKERS.search(text) is not None


def query_rule_violations(query: str) -> list[str]:
    """The mechanical rules every query must pass, whatever the reviewer said: the method's
    list and no more (no citation markers, no upper-case tokens, no meta-language, no method
    phrases, starts with "How to", at most MAX_QUERY_WORDS words)."""
    problems = []
    text = query.strip()
    low = text.lower()
    if not text.startswith(("How to ", "how to ")):
        problems.append('must start with "How to"')
    if has_citation_marker(text):
        problems.append("contains a citation marker")
    if any(tok.isupper() and len(tok) > 1 for tok in re.findall(r"[A-Za-z]+", text)):
        problems.append("contains an upper-case token (acronym or variable)")
    words = re.findall(r"[a-z']+", low)
    meta = [w for w in META_WORDS if w in words] + _phrases(META_PHRASES, low)
    if meta:
        problems.append(f"contains meta-language: {', '.join(dict.fromkeys(meta))}")
    method = _phrases(METHOD_PHRASES, low)
    if method:
        problems.append(f"names a method: {', '.join(dict.fromkeys(method))}")
    if len(text.split()) > MAX_QUERY_WORDS:
        problems.append(f"longer than {MAX_QUERY_WORDS} words")
    return problems


def form_violations(query: str) -> list[str]:
    """What in a query breaks the schema's pattern beyond the mechanical rules (which say the
    rest), in words a model can act on: the rewrite is regenerated with them."""
    problems = []
    if query != " ".join(query.split()):
        problems.append("words must be separated by single spaces, on one line")
    if not query.endswith("?") or query.count("?") != 1:
        problems.append('it must be one question ending in its only "?"')
    body = query.rstrip("?")
    odd = sorted({c for c in body if not re.match(rf"[ A-Z{QUERY_WORD_CHARS}]", c)})
    if odd:
        problems.append(f"it may not contain {' '.join(repr(c) for c in odd)}")
    if any(len(w) > WORD_CHARS for w in body.split()):
        problems.append(f"no word may be longer than {WORD_CHARS} characters")
    if len(body.split()) < 3:
        problems.append('it must say what to do after "how to"')
    return problems


def form_issue(raw: str | None, error: str | None) -> tuple[str | None, str]:
    """(the query the refused answer held, if one can be read; why the schema refused it)."""
    query = _query_in(raw)
    if query is None:
        return None, f"the answer held no readable question ({error or 'no answer'})"
    reasons = form_violations(query)
    if not reasons:  # a bound only the schema states (its length in characters)
        reasons = [error or "it does not fit the required form"]
    return query, "the question does not fit the required form: " + "; ".join(reasons)


def _query_in(raw: str | None) -> str | None:
    if not raw:
        return None
    start, end = raw.find("{"), raw.rfind("}")
    try:
        value = json.loads(raw[start : end + 1], strict=False) if 0 <= start < end else None
    except json.JSONDecodeError:
        return None
    query = value.get("query") if isinstance(value, dict) else None
    return query if isinstance(query, str) and query.strip() else None


def query_objections(
    query: str | None,
    *,
    problem_only: bool | None,
    grounded: bool | None,
    well_formed: bool | None,
    issue: str | None,
    form: str | None = None,
) -> list[str]:
    """Why a written query is not accepted (empty: accepted): the schema's refusal of its form
    (`form`: then the reviewer never saw it) or the reviewer's booleans, then the mechanical
    rules. The writer regenerates with these; afterwards they decide the kept query."""
    if form:
        reasons = [form]
    else:
        review_ok = bool(problem_only and grounded and well_formed)
        reasons = [] if review_ok else [issue or "the reviewer rejected it"]
    return reasons + (query_rule_violations(query) if query else [])


def taken_from_d(transfer_path: Mapping[str, Any] | str | None) -> str:
    """What q took from d (`transfer_path.from_d`), told to the extractor so that it leaves it
    out of the problem. Only that part: the path's `helps_q` is q's goal, which the problem must
    keep. A one-string path (from judgments before the path had parts) cannot be split safely,
    so it tells nothing."""
    if not isinstance(transfer_path, Mapping):
        return "(not stated)"
    taken = (transfer_path.get("from_d") or "").strip()
    return taken[:500] if taken else "(not stated)"


MAX_REGENERATIONS = 2
PLAIN_PROSE = "Write plain prose with no symbols, formulas or variables."


def _earlier(label: str, text: str | None, objection: str) -> str:
    """The data block's note on a regenerated step: what was written before and why it was
    rejected (empty on the first attempt)."""
    if not objection:
        return ""
    return f"Earlier {label} (rejected): {text or '(none could be read)'}\nObjection: {objection}"


def citing_paper(row: Mapping[str, Any]) -> dict[str, str]:
    """What the extraction and the review read of q: its title, abstract and citing sentences
    with every citation marker masked."""
    return {
        "q_title": row["q_title"] or "",
        "q_abstract": row["q_abstract"] or "",
        "contexts": format_contexts([mask_citations(c) for c in row["contexts"] or []]),
    }


class QueryWriter(LLMTask):
    stage = WRITE_QUERIES
    prompts = (
        prompts.load("extract", "v2"),
        prompts.load("rewrite", "v2"),
        prompts.load("review", "v2"),
    )
    prefix_columns = ("q_title", "q_abstract")
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
            ("form_issue", pa.string()),
            ("review_problem_only", pa.bool_()),
            ("review_grounded", pa.bool_()),
            ("review_well_formed", pa.bool_()),
            ("review_issue", pa.string()),
            ("regenerations", pa.int8()),
        ]
    )

    async def review(
        self, client: LLMClient, paper: dict[str, str], problem: str, query: str, usage: Usage
    ) -> Outcome[QueryReview]:
        """The review step (P3 step 3) on its own: `cpr judge-check` measures the reviewer
        through this very call. `paper` is `citing_paper(row)`."""
        prompt = self.prompts[2].render(**paper, problem=problem, query=query)
        return await client.ask(self.stage, prompt, QueryReview, usage=usage)

    def derive(self, table: pa.Table) -> pa.Table:
        """`query` (the written one, where accepted) and `drop_reason` (the objections, where
        not), from the last attempt of every `ok` row. A loop over rows: the rules are regexes
        over one query, and there is one row per verified pair."""
        queries, reasons = [], []
        for row in table.select(
            [
                "status",
                "written_query",
                "form_issue",
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
                    form=row["form_issue"],
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
        extract, rewrite, _ = self.prompts
        paper = citing_paper(row)
        objection, problem, query = "", None, None
        out: dict[str, Any] = self.empty_output()
        for attempt in range(MAX_REGENERATIONS + 1):
            p = await client.ask(
                self.stage,
                extract.render(
                    **paper,
                    taken=taken_from_d(row["transfer_path"]),
                    extra=PLAIN_PROSE if objection else "",
                    earlier=_earlier("statement", problem, objection),
                ),
                ProblemStatement,
                usage=usage,
            )
            if p.value is None:
                return out, p.status, f"problem extraction: {p.error}"
            problem = p.value.problem
            q = await client.ask(
                self.stage,
                rewrite.render(
                    problem=problem,
                    d_fields=row["d_fields"] or "",
                    earlier=_earlier("question", query, objection),
                ),
                WrittenQuery,
                usage=usage,
            )
            out = {**self.empty_output(), "problem": problem, "regenerations": attempt}
            if q.value is None and q.status != "invalid":
                return out, q.status, f"query rewrite: {q.error}"
            if q.value is None:
                # the model kept writing a question the schema refuses: an objection to the
                # question, regenerated like the reviewer's, not a failure of the pair
                query, form = form_issue(q.raw, q.error)
                objections = query_objections(
                    query,
                    problem_only=None,
                    grounded=None,
                    well_formed=None,
                    issue=None,
                    form=form,
                )
                out |= {"written_query": query, "form_issue": form}
            else:
                query = q.value.query.strip()
                r = await self.review(client, paper, problem, query, usage)
                if r.value is None:
                    return out, r.status, f"query review: {r.error}"
                out |= {
                    "written_query": query,
                    "review_problem_only": r.value.problem_only,
                    "review_grounded": r.value.grounded,
                    "review_well_formed": r.value.well_formed,
                    "review_issue": r.value.issue,
                }
                objections = query_objections(
                    query,
                    problem_only=r.value.problem_only,
                    grounded=r.value.grounded,
                    well_formed=r.value.well_formed,
                    issue=r.value.issue,
                )
            out["query_words"] = len(query.split()) if query else None
            if not objections:
                break
            objection = "; ".join(objections)
        return out, "ok", None
