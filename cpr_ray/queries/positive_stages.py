"""The positive-collection stages (§3.2 P2–P3): judge-analogy → judge-transfer → write-queries →
dedup → score-positives. Each reads its upstream's published table, runs one LLM step through
`run_llm_task` (cache, ledger, retries) and publishes its rows, its failures and survival stats.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.config import Config
from cpr_ray.corpus.tables import PinnedTable, paper_texts
from cpr_ray.llm.spend_ledger import write_failures
from cpr_ray.llm.step_runner import TaskRun, cached_note, endpoint_url, run_llm_task
from cpr_ray.llm.task import without_answer_columns
from cpr_ray.mining.mining_rules import PAIR_FIELDS
from cpr_ray.queries.analogy import analogy_passed
from cpr_ray.queries.dedup import (
    SameProblemJudge,
    StrongestAnalogyJudge,
    keep_strongest,
    model_choices,
    query_pairs,
    strongest_requests,
)
from cpr_ray.queries.judges import AnalogyJudge, TransferVerifier
from cpr_ray.queries.usefulness import KEEP_USEFULNESS, UsefulnessGrader, grader_reference
from cpr_ray.queries.writing import QueryWriter
from cpr_ray.runs.stage_runner import Reads, StageOutput, StageRun, TableRecord, console, entry
from cpr_ray.stages import (
    DEDUP,
    INGEST,
    JUDGE_ANALOGY,
    JUDGE_TRANSFER,
    MINE,
    WRITE_QUERIES,
)
from cpr_ray.storage.store import Storage, join
from cpr_ray.tables import duckdb_sql as duck
from cpr_ray.tables.schemas import passages


def _with_texts(storage: Storage, papers: PinnedTable, pairs: pa.Table) -> pa.Table:
    texts = paper_texts(
        storage,
        papers,
        pa.concat_arrays([pairs["base_id"].combine_chunks(), pairs["cited_id"].combine_chunks()]),
    )
    return duck.query(
        """SELECT p.*, q.title AS q_title, q.abstract AS q_abstract, q.top_topic AS q_topic,
                  q.field AS q_field, d.title AS d_title, d.abstract AS d_abstract,
                  d.top_topic AS d_topic, d.field AS d_field
           FROM (SELECT *, row_number() OVER () AS _row FROM pairs) p
           LEFT JOIN texts q ON q.corpus_id = p.base_id
           LEFT JOIN texts d ON d.corpus_id = p.cited_id
           ORDER BY p._row""",
        pairs=pairs,
        texts=texts,
    ).drop_columns(["_row"])


def _cap(cfg: Config, table: pa.Table) -> pa.Table:
    """The dry run scales down here, not by skipping stages."""
    cap = cfg.llm.max_rows_per_stage
    return table.slice(0, cap) if cap is not None and table.num_rows > cap else table


def _publish(
    run: StageRun, result: TaskRun, keep: pa.Array, name: str, extra_stats: dict[str, Any]
) -> StageOutput:
    rows_uri = join(run.out, f"{name}.parquet")
    kept = result.table.filter(keep)
    run.storage.write_parquet(kept, rows_uri)
    all_uri = join(run.out, "judged.parquet")
    run.storage.write_parquet(result.table, all_uri)
    n_failures = write_failures(run.storage, result.table, join(run.out, "failures.parquet"))
    stats = {
        **result.stats,
        "rows_in": result.table.num_rows,
        "rows_out": kept.num_rows,
        "survival": round(kept.num_rows / result.table.num_rows, 4) if result.table.num_rows else 0,
        "failures": n_failures,
        **extra_stats,
    }
    console.print(
        f"  {run.name}: {kept.num_rows:,} of {result.table.num_rows:,} rows pass "
        f"({stats['survival']:.0%}); failures {n_failures:,}; calls {stats['calls']:,}, tokens "
        f"{stats['prompt_tokens']:,} in{cached_note(stats)} / {stats['completion_tokens']:,} out; "
        f"${stats['cost_usd']:,.2f}"
    )
    return StageOutput(
        tables={
            name: {"uri": rows_uri, "format": "parquet", "rows": kept.num_rows},
            "judged": {"uri": all_uri, "format": "parquet", "rows": result.table.num_rows},
        },
        stats=stats,
        complete=result.complete,
    )


def _ok(table: pa.Table, column: str) -> pa.Array:
    return pc.and_(pc.equal(table["status"], "ok"), pc.fill_null(table[column], False))


# -- stage bodies ------------------------------------------------------------------------------


def run_judge_analogy(run: StageRun, reads: Reads) -> StageOutput:
    """Judge mine's pairs: analogy or not (§3.2 P2, App. B.1)."""
    papers = PinnedTable.of(reads[INGEST], "papers")
    pairs = _cap(run.cfg, run.storage.read_parquet(reads[MINE]["tables"]["pairs"]["uri"]))
    rows = _with_texts(
        run.storage,
        papers,
        pairs.select(["base_id", "cited_id", "contexts", *PAIR_FIELDS]),
    )
    hold_out = run.cfg.llm.hold_out_flagged_inputs
    result = run_llm_task(
        run, AnalogyJudge(hold_out_flagged=hold_out), rows, base_url=endpoint_url(run.cfg.llm)
    )
    table = result.table
    decisions = table.filter(pc.equal(table["status"], "ok"))["decision"]
    counts = {
        d: int(pc.sum(pc.equal(decisions, d)).as_py() or 0)
        for d in ("observed_analogy", "potential_analogy", "not_analogy")
    }
    flagged = pc.greater(pc.list_value_length(table["input_flags"]), 0)
    held_out = pc.and_(analogy_passed(table, hold_out_flagged=False), pc.invert(table["passed"]))
    injection = {
        "flagged_inputs": int(pc.sum(flagged).as_py() or 0),
        "held_out_flagged": int(pc.sum(held_out).as_py() or 0),
    }
    if injection["flagged_inputs"]:
        console.print(
            f"  {run.name}: {injection['flagged_inputs']:,} pairs have instruction-like text in "
            f"their inputs (input_flags); {injection['held_out_flagged']:,} that would pass are "
            f"held out (llm.hold_out_flagged_inputs={hold_out})"
        )
    return _publish(
        run, result, _ok(table, "passed"), "analogies", {"decisions": counts, **injection}
    )


def run_judge_transfer(run: StageRun, reads: Reads) -> StageOutput:
    """Verify judge-analogy's analogies with a second model: transfer or reject (App. B.2)."""
    analogies_uri = reads[JUDGE_ANALOGY]["tables"]["analogies"]["uri"]
    rows = without_answer_columns(run.storage.read_parquet(analogies_uri))
    result = run_llm_task(run, TransferVerifier(), rows, base_url=endpoint_url(run.cfg.llm))
    same = run.cfg.llm.same_verifier()
    if same:
        console.print(
            f"  {run.name}: verified by {run.cfg.llm.for_stage(run.name)[0]}, the analogy judge's "
            "own model (llm.allow_same_verifier): the method verifies with a second model"
        )
    verifier = {"verifier_model": run.cfg.llm.for_stage(run.name)[0], "same_verifier": same}
    return _publish(run, result, _ok(result.table, "verified"), "transfers", verifier)


def run_write_queries(run: StageRun, reads: Reads) -> StageOutput:
    """Write a reviewed "How to …" query for each transfer (App. B.3)."""
    transfers_uri = reads[JUDGE_TRANSFER]["tables"]["transfers"]["uri"]
    rows = without_answer_columns(run.storage.read_parquet(transfers_uri))
    d_fields = [
        ", ".join(x for x in (f, t) if x)
        for f, t in zip(rows["d_field"].to_pylist(), rows["d_topic"].to_pylist(), strict=True)
    ]
    rows = rows.append_column("d_fields", pa.array(d_fields, pa.string()))
    result = run_llm_task(run, QueryWriter(), rows, base_url=endpoint_url(run.cfg.llm))
    answered = pc.equal(result.table["status"], "ok")
    written = pc.and_(answered, pc.is_valid(result.table["query"]))
    ok_rows = result.table.filter(written)
    words = pc.mean(ok_rows["query_words"]).as_py() if ok_rows.num_rows else None
    dropped = result.table.filter(pc.is_valid(result.table["drop_reason"]))
    regenerated = pc.and_(answered, pc.greater(pc.fill_null(result.table["regenerations"], 0), 0))
    return _publish(
        run,
        result,
        written,
        "queries",
        {
            "mean_query_words": round(words, 1) if words else None,
            "regenerated": int(pc.sum(regenerated).as_py() or 0),
            "dropped_after_regenerations": dropped.num_rows,
            # of those, the ones whose last question the answer schema refused (its form)
            "dropped_for_form": int(pc.sum(pc.is_valid(dropped["form_issue"])).as_py() or 0),
        },
    )


def _merged_stats(*parts: dict[str, Any]) -> dict[str, Any]:
    """One stage's stats over its LLM tasks: counts, tokens and cost add up; the models and
    prompt versions are listed (a task's own stats stay under its name in the stage's stats)."""
    out: dict[str, Any] = {}
    for stats in parts:
        for key, value in stats.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                seen = [v for v in str(out.get(key) or "").split("+") if v]
                out[key] = "+".join(dict.fromkeys([*seen, str(value)]))
            else:
                out[key] = round(out.get(key, 0) + value, 6)
    return out


def run_dedup(run: StageRun, reads: Reads) -> StageOutput:
    """Keep one query per problem of a base paper: the strongest analogy (App. B.4)."""
    return _dedup(run, reads[WRITE_QUERIES]["tables"]["queries"]["uri"])


def _dedup(run: StageRun, queries_uri: str) -> StageOutput:
    queries = without_answer_columns(run.storage.read_parquet(queries_uri))
    pairs = query_pairs(queries)
    url = endpoint_url(run.cfg.llm)
    result = run_llm_task(run, SameProblemJudge(), pairs, base_url=url)
    same = result.table.filter(_ok(result.table, "same_problem"))
    links = list(
        zip(
            same["base_id"].to_pylist(),
            same["cited_a"].to_pylist(),
            same["cited_b"].to_pylist(),
            strict=True,
        )
    )
    # the strongest analogy of each group of two or more: one call per group, the ranking only
    # where the answer names no candidate
    requests = strongest_requests(queries, links)
    strongest = (
        run_llm_task(run, StrongestAnalogyJudge(), requests, base_url=url)
        if requests.num_rows
        else None
    )
    deduped = keep_strongest(queries, links, model_choices(strongest.table) if strongest else {})
    rows_uri = join(run.out, "queries.parquet")
    kept = deduped.filter(deduped["kept"])
    run.storage.write_parquet(kept, rows_uri)
    pairs_uri = join(run.out, "comparisons.parquet")
    run.storage.write_parquet(result.table, pairs_uri)
    n_failures = write_failures(run.storage, result.table, join(run.out, "failures.parquet"))
    tables: dict[str, TableRecord] = {
        "queries": {"uri": rows_uri, "format": "parquet", "rows": kept.num_rows},
        "comparisons": {"uri": pairs_uri, "format": "parquet", "rows": pairs.num_rows},
    }
    by = pc.value_counts(kept["dedup_chosen_by"]).to_pylist() if kept.num_rows else []
    chosen = {c["values"]: c["counts"] for c in by}
    if strongest is not None:
        picks = {
            (r["base_id"], r["dedup_group"]): (r["cited_id"], r["dedup_chosen_by"])
            for r in kept.select(
                ["base_id", "dedup_group", "cited_id", "dedup_chosen_by"]
            ).to_pylist()
        }
        groups = list(zip(*(strongest.table[c].to_pylist() for c in ("base_id", "dedup_group"))))
        choices = strongest.table.append_column(
            "chosen_cited_id", pa.array([picks[g][0] for g in groups], pa.int64())
        ).append_column("chosen_by", pa.array([picks[g][1] for g in groups], pa.string()))
        choices_uri = join(run.out, "strongest.parquet")
        run.storage.write_parquet(choices, choices_uri)
        tables["strongest"] = {"uri": choices_uri, "format": "parquet", "rows": choices.num_rows}
        n_failures += write_failures(
            run.storage, choices, join(run.out, "strongest_failures.parquet")
        )
    stats = {
        **_merged_stats(result.stats, *([strongest.stats] if strongest else [])),
        "same_problem": result.stats,
        "strongest": strongest.stats if strongest else None,
        "rows_in": queries.num_rows,
        "rows_out": kept.num_rows,
        "comparisons": pairs.num_rows,
        "same_problem_links": len(links),
        "groups": requests.num_rows,
        "groups_chosen_by_model": chosen.get("model", 0),
        "groups_chosen_by_rule": chosen.get("rule", 0),
        "survival": round(kept.num_rows / queries.num_rows, 4) if queries.num_rows else 0,
        "failures": n_failures,
    }
    console.print(
        f"  dedup: {pairs.num_rows:,} comparisons within base papers, {len(links):,} same-problem;"
        f" {requests.num_rows:,} groups of two or more (strongest chosen by the model in "
        f"{stats['groups_chosen_by_model']:,}, by the ranking in "
        f"{stats['groups_chosen_by_rule']:,}); {kept.num_rows:,} of {queries.num_rows:,} "
        f"queries kept; ${stats['cost_usd']:,.2f}"
    )
    return StageOutput(
        tables=tables,
        stats=stats,
        complete=result.complete and (strongest is None or strongest.complete),
    )


def run_score_positives(run: StageRun, reads: Reads) -> StageOutput:
    """Grade each kept query's positive 0–3 and keep those that help (App. B.5)."""
    queries_uri = reads[DEDUP]["tables"]["queries"]["uri"]
    rows = without_answer_columns(run.storage.read_parquet(queries_uri))
    mappings = [
        grader_reference(m, r)
        for m, r in zip(
            rows["object_mappings"].to_pylist(), rows["shared_relations"].to_pylist(), strict=True
        )
    ]
    rows = rows.append_column(
        "passage", passages(rows["d_title"], rows["d_abstract"])
    ).append_column("mappings", pa.array(mappings, pa.string()))
    result = run_llm_task(run, UsefulnessGrader(), rows, base_url=endpoint_url(run.cfg.llm))
    keep = pc.and_(
        pc.equal(result.table["status"], "ok"),
        pc.greater_equal(pc.fill_null(result.table["usefulness"], -1), KEEP_USEFULNESS),
    )
    scores = result.table.filter(pc.equal(result.table["status"], "ok"))["usefulness"]
    hist = {str(s): int(pc.sum(pc.equal(scores, s)).as_py() or 0) for s in range(4)}
    return _publish(run, result, keep, "positives", {"usefulness": hist})


# -- stage entry points --------------------------------------------------------------------------


# run (or skip) judge-analogy and return its manifest
judge_analogy = entry(JUDGE_ANALOGY)
