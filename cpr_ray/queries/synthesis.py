"""The `synthesize-queries` stage (complexity-aware training): several queries per CPR-train
positive, as multi-query training data, with the Q-D metrics of the build's queries and of the
synthesized set.

`synthesis.mode: diverse` asks, in one zero-shot call per document, one query of each kind
(factual, procedural, causal, conditional, keyword, comparison: the schema requires each once);
`paraphrase` rewrites each CPR-train query several ways, the low-diversity control. Every call
goes through the LLM layer (cache, ledger, retries, schema). The output, `multi-query.parquet`,
is the plain triplets format (`query`, `positive`, `negatives`) plus `positive_id` and `kind`:
`cpr train --format triplets` reads it, and the queries sharing a positive are siblings, never
each other's negatives.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Annotated, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from cpr_ray.config import SynthesisConfig
from cpr_ray.corpus.tables import PinnedTable, papers_by_id
from cpr_ray.llm import prompts
from cpr_ray.llm.answers import _Answer, normalized
from cpr_ray.llm.client import LLMClient, Status, Usage
from cpr_ray.llm.step_runner import endpoint_url, run_llm_task
from cpr_ray.llm.task import LLMTask
from cpr_ray.queries.qd_metrics import cross_encoder_scorer, qd_report
from cpr_ray.queries.writing import MAX_QUERY_WORDS, QUERY_CHARS, WORD_CHARS
from cpr_ray.runs.stage_runner import Reads, StageOutput, StageRun, console, entry
from cpr_ray.stages import EXPORT, INGEST
from cpr_ray.stages import SYNTHESIZE_QUERIES as STAGE
from cpr_ray.storage.store import Storage, join
from cpr_ray.tables.schemas import paper_text

MULTI_QUERY = pa.schema(
    [
        ("query", pa.string()),
        ("positive", pa.string()),
        ("negatives", pa.list_(pa.string())),
        ("positive_id", pa.int64()),
        ("kind", pa.string()),
        ("source_query_id", pa.string()),
    ]
)


QUERY_KINDS = ("factual", "procedural", "causal", "conditional", "keyword", "comparison")
# a word of a synthesized query: no spaces, no question mark, no longer than any word a query needs
_WORD = rf"[A-Za-z0-9,;:'()/%+.-]{{1,{WORD_CHARS}}}"
_WORDS = rf"(?: {_WORD}){{1,40}}"  # with the opening: at most MAX_QUERY_WORDS
# each kind opens its own way, so the six of one answer can never be the same string, and a
# grammar-constrained model cannot run on past the word bound
KIND_PATTERNS = {
    "factual": rf"^What{_WORDS}\?$",
    "procedural": rf"^How to{_WORDS}\?$",
    "causal": rf"^Why{_WORDS}\?$",
    "conditional": rf"^(?:If|When){_WORDS}\?$",
    "keyword": rf"^[a-z0-9-]{{2,{WORD_CHARS}}}(?: [a-z0-9-]{{2,{WORD_CHARS}}}){{1,7}}$",
    "comparison": rf"^(?:How does|How do|Which){_WORDS}\?$",
}
SynthQuery = Annotated[
    str, Field(pattern=rf"^{_WORD}(?: {_WORD}){{1,44}}\??$", max_length=QUERY_CHARS)
]


def _kind(kind: str, what: str) -> Any:
    return Field(pattern=KIND_PATTERNS[kind], max_length=QUERY_CHARS, description=what)


class DiverseQueries(_Answer):
    """One query of each kind, as fields: a schema can require every kind exactly once."""

    factual: str = _kind("factual", "What … ? A fact or quantity the paper reports.")
    procedural: str = _kind("procedural", "How to … ? How to do what the paper does.")
    causal: str = _kind("causal", "Why … ? Why something happens, or what causes it.")
    conditional: str = _kind("conditional", "If/When … ? What happens under a condition.")
    keyword: str = _kind("keyword", "2-8 lower-case search keywords.")
    comparison: str = _kind("comparison", "How does/How do/Which … ? How two things compare.")


class Paraphrases(_Answer):
    paraphrases: list[SynthQuery] = Field(min_length=2, max_length=len(QUERY_KINDS))


def synthesized_problems(queries: Sequence[str], seed: str | None = None) -> list[str]:
    """What makes a synthesized set unusable as several training queries: blanks, repeats, a
    query over the word bound, a paraphrase that only copies its seed."""
    problems = []
    normal = [normalized(q) for q in queries]
    if len(set(normal)) < len(normal):
        problems.append("two queries are the same; each must be different")
    long = [q for q in queries if len(q.split()) > MAX_QUERY_WORDS]
    if long:
        problems.append(f"{len(long)} query(ies) longer than {MAX_QUERY_WORDS} words")
    if seed is not None and normalized(seed) in normal:
        problems.append("a paraphrase repeats the query word for word")
    return problems


class QuerySynthesizer(LLMTask):
    """One document (diverse) or one query (paraphrase) → several queries."""

    stage = STAGE
    output_schema = pa.schema(
        [("kinds", pa.list_(pa.string())), ("queries", pa.list_(pa.string()))]
    )

    def __init__(self, mode: str, paraphrases: int) -> None:
        self.mode, self.paraphrases = mode, paraphrases
        self.prompts = (prompts.load("synthesize" if mode == "diverse" else "paraphrase"),)
        self.key_columns = ("title", "abstract") if mode == "diverse" else ("query",)

    async def run(
        self, client: LLMClient, row: dict[str, Any], usage: Usage
    ) -> tuple[dict[str, Any], Status, str | None]:
        if self.mode == "diverse":
            prompt = self.prompts[0].render(
                title=row["title"] or "", abstract=row["abstract"] or ""
            )
            out = await client.ask(
                self.stage,
                prompt,
                DiverseQueries,
                usage=usage,
                check=lambda a: synthesized_problems([getattr(a, k) for k in QUERY_KINDS]),
            )
            if out.value is None:
                return self.empty_output(), out.status, out.error
            queries = [getattr(out.value, k) for k in QUERY_KINDS]
            return {"kinds": list(QUERY_KINDS), "queries": queries}, "ok", None
        prompt = self.prompts[0].render(query=row["query"], n=str(self.paraphrases))
        said = await client.ask(
            self.stage,
            prompt,
            Paraphrases,
            usage=usage,
            check=lambda a: synthesized_problems(a.paraphrases, seed=row["query"]),
        )
        if said.value is None:
            return self.empty_output(), said.status, said.error
        found = said.value.paraphrases
        return {"kinds": ["paraphrase"] * len(found), "queries": found}, "ok", None


def _inputs(run: StageRun, train: pa.Table, papers: PinnedTable) -> pa.Table:
    """The rows to ask about: one per positive (diverse) or per CPR-train query (paraphrase),
    with the positive's title and abstract; `llm.max_rows_per_stage` caps them."""
    if run.cfg.synthesis.mode == "diverse":
        first = np.unique(train["positive_id"].to_numpy(), return_index=True)[1]
        train = train.take(pa.array(np.sort(first)))
    cap = run.cfg.llm.max_rows_per_stage
    train = train.slice(0, cap) if cap is not None else train
    texts = papers_by_id(run.storage, papers, train["positive_id"], ["title", "abstract"])
    at = pc.index_in(train["positive_id"], texts["corpus_id"])
    return train.append_column("title", texts["title"].take(at)).append_column(
        "abstract", texts["abstract"].take(at)
    )


def multi_query_rows(answered: pa.Table) -> pa.Table:
    """MULTI_QUERY rows from the answered inputs: one per synthesized query."""
    ok = answered.filter(pc.equal(answered["status"], "ok"))
    ok = ok.append_column("positive", paper_text(ok["title"], ok["abstract"])).to_pylist()
    rows = [
        {
            "query": q,
            "positive": r["positive"],
            "negatives": [],
            "positive_id": r["positive_id"],
            "kind": kind,
            "source_query_id": r["query_id"],
        }
        for r in ok
        for kind, q in zip(r["kinds"], r["queries"], strict=True)
    ]
    return pa.Table.from_pylist(rows, MULTI_QUERY)


def _groups(queries: pa.Table, key: str) -> dict[Any, list[str]]:
    out: dict[Any, list[str]] = {}
    for k, q in zip(queries[key].to_pylist(), queries["query"].to_pylist(), strict=True):
        out.setdefault(k, []).append(q)
    return out


def qd_metrics(
    cfg: SynthesisConfig, build: pa.Table, synthesized: pa.Table, storage: Storage
) -> dict[str, Any]:
    """Q-D metrics of the build's queries and of the synthesized set, both against the build's
    queries; Dist-Sim and CE only where their models are configured. Query vectors come from
    the build's store (`query_store`): a rerun encodes only queries it has not seen."""
    from cpr_ray.queries import query_store
    from cpr_ray.retrieval.encoder import DenseEncoder
    from cpr_ray.retrieval.spec import EncoderSpec

    embed = None
    if cfg.embed_model:
        spec = EncoderSpec(
            model=cfg.embed_model, device=cfg.device, setting="synthesis.embed_model"
        )
        encoder = cache(lambda: DenseEncoder(spec))  # loaded only if a text is new
        embed = query_store.stored(storage, spec, lambda t: encoder().encode_queries(t))
    scorer = cross_encoder_scorer(cfg.cross_encoder, cfg.device) if cfg.cross_encoder else None
    reference = build["query"].to_pylist()
    out = {}
    for name, table in (("build", build), ("synthesized", synthesized)):
        report = qd_report(
            _groups(table, "positive_id"),
            reference,
            embed=embed or (lambda texts: np.zeros((len(texts), 1))),
            paraphrase=scorer,
            threshold=cfg.paraphrase_threshold,
        )
        if embed is None:
            report["dist_sim"] = None  # no synthesis.embed_model
        out[name] = report
    out["models"] = {"embed": cfg.embed_model, "cross_encoder": cfg.cross_encoder}
    return out


def run_synthesis(run: StageRun, reads: Reads) -> StageOutput:
    """Synthesize multi-query training data from the export's queries (its `synthesis:`)."""
    train_uri = reads[EXPORT]["tables"]["cpr-train"]["uri"]
    eval_uri = reads[EXPORT]["tables"]["cpr-eval"]["uri"]
    papers = PinnedTable.of(reads[INGEST], "papers")
    cfg = run.cfg.synthesis
    train = run.storage.read_parquet(train_uri, ["query_id", "query", "positive_id"])
    build = pa.concat_tables(
        [train, run.storage.read_parquet(eval_uri, ["query_id", "query", "positive_id"])]
    )
    inputs = _inputs(run, train, papers)
    task = QuerySynthesizer(cfg.mode, cfg.paraphrases)
    result = run_llm_task(run, task, inputs, base_url=endpoint_url(run.cfg.llm))
    rows = multi_query_rows(result.table)
    out_uri = join(run.out, "multi-query.parquet")
    run.storage.write_parquet(rows, out_uri)
    metrics = qd_metrics(cfg, build, rows, run.storage) if rows.num_rows else {}
    stats = {**result.stats, "mode": cfg.mode, "inputs": inputs.num_rows, "queries": rows.num_rows}
    stats["qd_metrics"] = metrics
    line = (
        f"  {STAGE}: {rows.num_rows:,} queries for {inputs.num_rows:,} input(s) ({cfg.mode}); "
        f"${result.stats['cost_usd']:,.2f}"
    )
    if metrics:
        syn, own = metrics["synthesized"], metrics["build"]
        line += (
            f"; Self-BLEU {syn['self_bleu']:.3f} (build {own['self_bleu']:.3f}), Len-Sim "
            f"{syn['len_sim']:.3f}, mean content words {syn['cw']['mean']:.1f} (build "
            f"{own['cw']['mean']:.1f})"
            + ("" if syn["dist_sim"] is None else f", Dist-Sim {syn['dist_sim']:.3f}")
            + (
                f", CE paraphrases {syn['ce_paraphrase_share']:.0%}"
                if "ce_paraphrase_share" in syn
                else ""
            )
        )
    console.print(line)
    return StageOutput(
        tables={"multi-query": {"uri": out_uri, "format": "parquet", "rows": rows.num_rows}},
        stats=stats,
        complete=result.complete,
    )


# run (or skip) synthesize-queries and return its manifest
synthesize_queries = entry(STAGE)
