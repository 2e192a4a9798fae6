"""The `judge-negatives` stage (§3.3 N2, App. B.6): pooled candidates → judged hard negatives.

Each query's three candidate groups are walked in pool order (`position`); each candidate is
graded 0–3 with the positives' usefulness prompt, without mappings; one that scores at most
`dataset.max_negative_usefulness` is a negative, and the first `eval_negatives_per_group`
(eval queries) or `train_negatives_per_group` (train queries) negatives of a group are kept.
The split decides which need a query has, computed by the same pure function export uses.

Judging costs an LLM call per candidate, so the walk buys only what it keeps: each round judges,
per group still short, the negatives it lacks plus a margin, and later rounds run only for the
groups whose candidates turned out useful (false negatives). Train queries never judge an eval
paper (export could not keep it), and `llm.max_rows_per_stage` caps the rows of all rounds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.config import Config, DatasetConfig
from cpr_ray.corpus.tables import PinnedTable, paper_texts
from cpr_ray.dataset.split import EVAL, TRAIN, assign_split, eval_papers
from cpr_ray.errors import InputError
from cpr_ray.llm.spend_ledger import write_failures
from cpr_ray.llm.step_runner import TaskRun, endpoint_url, run_llm_task
from cpr_ray.queries.usefulness import KEEP_USEFULNESS, UsefulnessGrader
from cpr_ray.runs.stage_runner import Reads, StageOutput, StageRun, console, entry
from cpr_ray.stages import INGEST, POOL
from cpr_ray.stages import JUDGE_NEGATIVES as STAGE
from cpr_ray.storage.store import Storage, join
from cpr_ray.tables import duckdb_sql as duck
from cpr_ray.tables.schemas import passages

GROUPS = ("shares_query_topic", "shares_positive_topic", "other")  # pool order across groups
CANDIDATE_COLUMNS = ["query_id", "candidate_id", "group", "position"]
NEGATIVES = pa.schema(
    [
        ("query_id", pa.string()),
        ("candidate_id", pa.int64()),
        ("group", pa.string()),
        ("position", pa.int32()),
        ("usefulness", pa.int8()),
        ("kept", pa.bool_()),
        ("split", pa.string()),
    ]
)
# what the walk reads of a judged row beside the candidate's own columns
JUDGED_STATE = [("usefulness", pa.int8()), ("status", pa.string())]
SHORT_EXAMPLES = 20
LLM_COUNTS = (
    "rows",
    "cached",
    "carried",  # of the cached: the last run's answers, carried without a cache lookup
    "asked",
    "new_ok",
    "new_invalid",
    "new_failed",
    "calls",
    "prompt_tokens",
    "completion_tokens",
    "cached_prompt_tokens",
)


def group_rank(column: str = '"group"') -> str:
    """SQL: a group's place in GROUPS, so every table of candidates sorts in one walk order."""
    return " ".join(
        ["CASE", *(f"WHEN {column} = '{g}' THEN {i}" for i, g in enumerate(GROUPS)), "END"]
    )


class NegativeGrader(UsefulnessGrader):
    """N2: the positives' usefulness grader (B.5) without mappings (B.6), as its own stage, so
    it has its own cache, ledger lines and `llm.stages.judge-negatives` model. It reads no
    reference block, so it is not keyed by the note that introduces one."""

    stage = STAGE
    prompts = UsefulnessGrader.prompts[:1]


# -- pure steps ----------------------------------------------------------------------------------


def split_fingerprint(ds: DatasetConfig) -> str:
    """The settings that decide the split and the negatives bought for it (not the export's
    licences): export checks it computes the split this stage judged for."""
    payload = ds.model_dump(mode="json", exclude={"open_licenses"})
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def needs(split: pa.Table, ds: DatasetConfig) -> pa.Array:
    """Negatives each query needs per group: eval's, train's, or none (held out)."""
    return pc.case_when(
        pc.make_struct(pc.equal(split["split"], EVAL), pc.equal(split["split"], TRAIN)),
        pa.scalar(ds.eval_negatives_per_group, pa.int32()),
        pa.scalar(ds.train_negatives_per_group, pa.int32()),
        pa.scalar(0, pa.int32()),
    )


def eligible_candidates(candidates: pa.Table, split: pa.Table, ds: DatasetConfig) -> pa.Table:
    """The candidates a query may take negatives from, in walk order (query, group, position),
    with the query's `split` and `need`.

    A query that needs none has none; a train query never gets an eval paper (the split's
    invariant); a candidate that is the query's own base or positive is never its negative.
    """
    split = split.append_column("need", needs(split, ds))
    return duck.query(
        f"""SELECT c.query_id, c.candidate_id, c."group", c.position, s.split, s.need
            FROM candidates c JOIN split s USING (query_id)
            WHERE s.need > 0
              AND c.candidate_id <> s.base_id AND c.candidate_id <> s.positive_id
              AND NOT (s.split = '{TRAIN}' AND c.candidate_id IN (SELECT id FROM withheld))
            ORDER BY c.query_id, {group_rank()}, c.position""",
        candidates=candidates.select(CANDIDATE_COLUMNS),
        split=split,
        withheld=pa.table({"id": eval_papers(split)}),
    )


def next_round(
    eligible: pa.Table, judged: pa.Table, *, max_usefulness: int, margin: float
) -> pa.Table:
    """The candidates to judge next, in walk order: for each group still short of its need, the
    `missing + ceil(missing * margin)` candidates after the last one judged, where `missing` is
    its need less the negatives found so far. Empty when every group is full or exhausted."""
    return duck.query(
        f"""WITH found AS (
                SELECT query_id, "group", max(position) AS last,
                       count(*) FILTER (WHERE status = 'ok' AND usefulness <= {max_usefulness})
                           AS negatives
                FROM judged GROUP BY query_id, "group"),
            todo AS (
                SELECT e.*, e.need - coalesce(f.negatives, 0) AS missing,
                       row_number() OVER (PARTITION BY e.query_id, e."group"
                                          ORDER BY e.position) AS k
                FROM eligible e LEFT JOIN found f USING (query_id, "group")
                WHERE e.position > coalesce(f.last, -1))
            SELECT * EXCLUDE (missing, k) FROM todo
            WHERE missing > 0
              AND k <= missing + CAST(ceil(missing * {float(margin)} - 1e-9) AS BIGINT)
            ORDER BY query_id, {group_rank()}, position""",
        eligible=eligible,
        judged=judged.select(["query_id", "group", "position", "usefulness", "status"]),
    ).cast(eligible.schema)


@dataclass
class Walk:
    """What the walk judged (the judge's rows of every round, in order) and how it ended."""

    judged: pa.Table
    rounds: int
    capped: bool  # the row budget ran out while some group still wanted candidates


def walk(
    eligible: pa.Table,
    judge: Callable[[pa.Table], pa.Table],
    *,
    max_usefulness: int,
    margin: float,
    budget: int | None = None,
) -> Walk:
    """Judge rounds of `next_round` until no group wants more or `budget` rows are spent.

    `judge` returns its input rows with at least `usefulness` and `status` (the LLM stage's
    `run_llm_task`; a scorer in tests), so the walk is the same pure loop in both.
    """
    parts: list[pa.Table] = []
    state = pa.schema(list(eligible.schema) + JUDGED_STATE).empty_table()
    spent = 0
    while True:
        todo = next_round(eligible, state, max_usefulness=max_usefulness, margin=margin)
        left = None if budget is None else budget - spent
        if left is not None and todo.num_rows > left:
            if left == 0:
                return Walk(_concat(parts, state), len(parts), capped=True)
            todo = todo.slice(0, left)
        if todo.num_rows == 0:
            return Walk(_concat(parts, state), len(parts), capped=False)
        out = judge(todo)
        parts.append(out)
        spent += todo.num_rows
        state = pa.concat_tables([state, out.select(state.column_names).cast(state.schema)])


def _concat(parts: list[pa.Table], empty: pa.Table) -> pa.Table:
    return pa.concat_tables(parts) if parts else empty


def mark_kept(judged: pa.Table, *, max_usefulness: int) -> pa.Table:
    """`judged` in walk order with `kept`: the candidate is a negative (answered, scored at most
    `max_usefulness`) and among the first `need` negatives of its group."""
    return duck.query(
        f"""WITH j AS (
                SELECT *, coalesce(status = 'ok' AND usefulness <= {max_usefulness}, false)
                              AS _negative
                FROM judged)
            SELECT * EXCLUDE (_negative),
                   _negative AND row_number() OVER (PARTITION BY query_id, "group", _negative
                                                    ORDER BY position) <= need AS kept
            FROM j ORDER BY query_id, {group_rank()}, position""",
        judged=judged,
    )


def group_counts(split: pa.Table, ds: DatasetConfig, marked: pa.Table) -> pa.Table:
    """Per (query, group) that needs negatives: its split, need, candidates judged and negatives
    kept — every group, also one the pool left empty."""
    split = split.append_column("need", needs(split, ds))
    return duck.query(
        f"""SELECT s.query_id, g."group", s.split, s.need,
                   count(m.candidate_id) AS judged,
                   count(m.candidate_id) FILTER (WHERE m.kept) AS kept
            FROM split s CROSS JOIN groups g
            LEFT JOIN marked m ON m.query_id = s.query_id AND m."group" = g."group"
            WHERE s.need > 0
            GROUP BY s.query_id, g."group", s.split, s.need
            ORDER BY s.query_id, {group_rank('g."group"')}""",
        split=split.select(["query_id", "split", "need"]),
        groups=pa.table({"group": list(GROUPS)}),
        marked=marked.select(["query_id", "group", "candidate_id", "kept"]),
    )


def negative_stats(split: pa.Table, ds: DatasetConfig, marked: pa.Table) -> dict[str, Any]:
    """Queries per split, negatives kept, short groups, and the false negatives the walk met
    (candidates scored at least the positives' threshold: useful papers the pool ranked as
    candidates)."""
    counts = group_counts(split, ds, marked)
    short = counts.filter(pc.less(counts["kept"], counts["need"]))
    ok = marked.filter(pc.equal(marked["status"], "ok"))
    scores = ok["usefulness"]
    false_neg = ok.filter(pc.greater_equal(scores, KEEP_USEFULNESS))
    per_split = {
        name: int(pc.sum(pc.equal(split["split"], name)).as_py() or 0)
        for name in (EVAL, TRAIN, "held_out")
    }
    kept = marked.filter(marked["kept"])
    return {
        "queries": per_split,
        "judged": marked.num_rows,
        "negatives_kept": {
            name: int(pc.sum(pc.equal(kept["split"], name)).as_py() or 0) for name in (EVAL, TRAIN)
        },
        "usefulness": {str(s): int(pc.sum(pc.equal(scores, s)).as_py() or 0) for s in range(4)},
        "false_negatives": false_neg.num_rows,
        "false_negatives_by_group": {
            g: int(pc.sum(pc.equal(false_neg["group"], g)).as_py() or 0) for g in GROUPS
        },
        "short_groups": {
            name: int(pc.sum(pc.equal(short["split"], name)).as_py() or 0) for name in (EVAL, TRAIN)
        },
        "queries_with_short_groups": len(pc.unique(short["query_id"])),
        "short_group_examples": short.slice(0, SHORT_EXAMPLES).to_pylist(),
    }


# -- the stage -----------------------------------------------------------------------------------


def grader_rows(
    storage: Storage, papers: PinnedTable, queries: pa.Table, candidates: pa.Table
) -> pa.Table:
    """Candidates with what the grader reads: the query, the candidate's passage, no mappings.

    Pool draws candidates from ingest's papers; one missing there means pool ran on another
    corpus, and grading an empty passage would make a junk negative, so it stops the stage.
    """
    texts = paper_texts(storage, papers, candidates["candidate_id"].combine_chunks())
    absent = pc.invert(pc.is_in(candidates["candidate_id"], value_set=texts["corpus_id"]))
    if pc.any(absent).as_py():
        row = candidates.filter(absent).slice(0, 1).to_pylist()[0]
        raise InputError(
            f"{STAGE}: candidate {row['candidate_id']} of query {row['query_id']} is not in "
            f"ingest's papers ({papers.uri}); pool ran on another corpus: rerun it "
            "(cpr build --stages pool --force)"
        )
    texts = pa.table(
        {"corpus_id": texts["corpus_id"], "passage": passages(texts["title"], texts["abstract"])}
    )
    return duck.query(
        """SELECT c.*, q.query, t.passage, CAST(NULL AS VARCHAR) AS mappings
           FROM (SELECT *, row_number() OVER () AS _row FROM candidates) c
           JOIN queries q USING (query_id)
           JOIN texts t ON t.corpus_id = c.candidate_id
           ORDER BY c._row""",
        candidates=candidates,
        queries=queries.select(["query_id", "query"]),
        texts=texts,
    ).drop_columns(["_row"])


def _llm_stats(runs: list[TaskRun], cfg: Config, task: NegativeGrader) -> dict[str, Any]:
    """One stage's LLM statistics over its rounds."""
    out: dict[str, Any] = {k: sum(r.stats[k] for r in runs) for k in LLM_COUNTS}
    out["cost_usd"] = round(sum(r.stats["cost_usd"] for r in runs), 6)
    out["model"] = cfg.llm.for_stage(STAGE)[0]
    out["prompt_version"] = task.prompt_version
    return out


def run_judge_negatives(run: StageRun, reads: Reads) -> StageOutput:
    """Grade pool's candidates 0–3 for each query, keeping those ≤ 1 as its negatives (§3.3 N2)."""
    queries_uri = reads[POOL]["tables"]["queries"]["uri"]
    candidates_uri = reads[POOL]["tables"]["candidates"]["uri"]
    papers = PinnedTable.of(reads[INGEST], "papers")
    ds = run.cfg.dataset
    queries = run.storage.read_parquet(queries_uri)
    split = assign_split(queries, eval_per_field=ds.eval_per_field, seed=ds.seed)
    candidates = run.storage.read_parquet(candidates_uri, CANDIDATE_COLUMNS)
    eligible = eligible_candidates(candidates, split, ds)
    task = NegativeGrader()
    runs: list[TaskRun] = []

    def judge(rows: pa.Table) -> pa.Table:
        result = run_llm_task(
            run,
            task,
            grader_rows(run.storage, papers, queries, rows),
            base_url=endpoint_url(run.cfg.llm),
        )
        runs.append(result)
        return result.table

    done = walk(
        eligible,
        judge,
        max_usefulness=ds.max_negative_usefulness,
        margin=ds.negatives_margin,
        budget=run.cfg.llm.max_rows_per_stage,
    )
    marked = mark_kept(done.judged, max_usefulness=ds.max_negative_usefulness)
    negatives_uri = join(run.out, "negatives.parquet")
    run.storage.write_parquet(marked.select(NEGATIVES.names).cast(NEGATIVES), negatives_uri)
    judged_uri = join(run.out, "judged.parquet")
    run.storage.write_parquet(marked, judged_uri)
    n_failures = write_failures(run.storage, marked, join(run.out, "failures.parquet"))
    stats = {
        **_llm_stats(runs, run.cfg, task),
        **negative_stats(split, ds, marked),
        "candidates": candidates.num_rows,
        "eligible": eligible.num_rows,
        "rounds": done.rounds,
        "capped_by_max_rows_per_stage": done.capped,
        "failures": n_failures,
        "split_fingerprint": split_fingerprint(ds),
    }
    kept = stats["negatives_kept"]
    console.print(
        f"  {STAGE}: {marked.num_rows:,} of {eligible.num_rows:,} candidates judged in "
        f"{done.rounds} round(s); negatives kept eval {kept[EVAL]:,} / train {kept[TRAIN]:,}; "
        f"false negatives {stats['false_negatives']:,}; short groups eval "
        f"{stats['short_groups'][EVAL]:,} / train {stats['short_groups'][TRAIN]:,}"
        + (" (capped by llm.max_rows_per_stage)" if done.capped else "")
        + f"; ${stats['cost_usd']:,.2f}"
    )
    return StageOutput(
        tables={
            "negatives": {"uri": negatives_uri, "format": "parquet", "rows": marked.num_rows},
            "judged": {"uri": judged_uri, "format": "parquet", "rows": marked.num_rows},
        },
        stats=stats,
        complete=all(r.complete for r in runs),
    )


# run (or skip) judge-negatives and return its manifest
judge_negatives = entry(STAGE)
