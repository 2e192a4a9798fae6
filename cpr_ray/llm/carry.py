"""Carrying an LLM step's answered rows from its stage's last run, so that a refresh keys only the
rows its diff reached.

Keying a row (`LLMTask.request_key`: its request inputs rendered to JSON and hashed, in Python)
and looking its key up in the stage's cache cost CPU for every row of the stage, every night,
though a refresh changes a few. Each run of a build stage therefore leaves, in its run folder,
the rows it answered `ok` (`remember`): their request inputs (the task's `key_columns`), request
key and answer. The next run of the stage (`refresh.incremental`) matches its input rows against
that memo of the stage's published run by the values of the `key_columns` themselves (one
vectorised DuckDB join, `IS NOT DISTINCT FROM` on every column: exact, no fingerprint that could
collide), and a matched row takes the memo's key and answer without being keyed or looked up; only
the rest go through the cache and, where it lacks them, the endpoint.

Why that equals keying every row (`refresh.incremental` false): a request key is a function of
the task's key inputs and of what is the same for every row of a call (stage, model, prompt
versions, answer schema, pin). Equal inputs therefore have equal keys as long as that constant
part is unchanged, which `carryable` proves by keying one memo row again with today's task,
model and pin (and the inputs' column types must equal the memo's: an int and a float that DuckDB
calls equal would key differently; a float anywhere falls back, as -0.0 = 0.0 does too). The
cache is append-only (compaction rewrites parts, never rows) and serves only `ok` answers, one per
key, so the memo's answer for a key is the one the cache serves (a cache removed by hand is the
one thing the carry does not see: the full path would ask again, so run that one with
`refresh.incremental=false`). Decisions are not carried:
`LLMTask.derive` runs on every row after the answers are joined, as in the full path, so a rule or
setting it reads (e.g. `llm.hold_out_flagged_inputs`) applies to carried rows too.

The memo read is the published run's folder, which stays until this run publishes (old runs go
after a publish, never the one a manifest names). No memo, an unreadable one, another model,
prompt, schema or pin: the step keys every row, says why in one line, and records it in its stats.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.errors import StorageError
from cpr_ray.llm.spend_ledger import first_per_key
from cpr_ray.llm.task import ANSWER_COLUMNS, KEY, LLMTask
from cpr_ray.runs.stage_runner import StageRun, read_manifest
from cpr_ray.storage.store import Storage, join
from cpr_ray.tables import duckdb_sql as duck

MEMO = "llm-rows"  # the folder, in a run's folder, of the rows each of its LLM steps answered
# an Arrow IPC stream, LZ4-compressed: the memo holds every answered row's inputs (abstracts,
# contexts), which Parquet's encoding would cost more CPU to write and read than its keying saves
SUFFIX = ".arrows"
WRITE = pa.ipc.IpcWriteOptions(compression="lz4")


def memo_folder(out: str, task: LLMTask) -> str:
    """Where a run (its folder `out`) keeps the rows of one LLM task: by the task's class, as a
    stage may run two tasks (dedup's two judges share the stage's name and cache)."""
    return join(out, MEMO, type(task).__name__)


def memo_columns(task: LLMTask) -> list[str]:
    """What a memo row holds: the request inputs, the key, the answer."""
    answers = [c for c in (*task.output_schema.names, *ANSWER_COLUMNS) if c != KEY]
    return [*task.key_columns, KEY, *answers]


def remember(storage: Storage, out: str, task: LLMTask, tag: str, joined: pa.Table) -> None:
    """Keep this call's `ok` rows (each key once) for the stage's next run: `joined` is every input
    row with its answer, before `derive`. One file per call (a stage may call a task more than
    once: rounds, tournaments)."""
    ok = joined.filter(pc.equal(joined["status"], "ok")).select(memo_columns(task))
    if pc.count_distinct(ok[KEY]).as_py() < ok.num_rows:
        ok = first_per_key(ok)
    with (
        storage.atomic_output(join(memo_folder(out, task), f"{tag}{SUFFIX}")) as stream,
        pa.ipc.new_stream(stream, ok.schema, options=WRITE) as writer,
    ):
        writer.write_table(ok)


@dataclass(frozen=True)
class Carry:
    """What the stage's last run answered that this call may reuse, or why it may not."""

    memo: pa.Table | None
    reason: str  # why the step keys every row; "" when it carries

    @property
    def note(self) -> str:
        return (
            f"{self.memo.num_rows:,} answered rows of the last run to match"
            if self.memo is not None
            else f"every row keyed ({self.reason})"
        )


def previous(
    run: StageRun, task: LLMTask, model: str, pin: dict | None, inputs: pa.Schema
) -> Carry:
    """The memo of the stage's published run for `task`, when its rows may be carried."""
    if not run.cfg.refresh.incremental:
        return Carry(None, "refresh.incremental is false")
    last = read_manifest(run.storage, run.name)
    if last is None or not last.get("output"):
        return Carry(None, "no earlier run")
    folder = memo_folder(last["output"], task)
    try:
        parts = [
            pa.ipc.open_stream(run.storage.read_bytes(join(folder, f.base_name))).read_all()
            for f in run.storage.list_folder(folder)
            if f.base_name.endswith(SUFFIX) and not f.base_name.startswith("_")
        ]
        memo = pa.concat_tables(parts) if parts else None
        if memo is not None and pc.count_distinct(memo[KEY]).as_py() < memo.num_rows:
            memo = first_per_key(memo)  # rounds of one run may have answered a key each
    except (OSError, pa.ArrowException, StorageError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return Carry(None, f"the last run's answered rows are unreadable: {first}")
    if memo is None:
        return Carry(None, f"run {last['run_id']} left no answered rows of {type(task).__name__}")
    reason = carryable(task, model, pin, inputs, memo)
    return Carry(None, reason) if reason else Carry(memo, "")


def _has_float(t: pa.DataType) -> bool:
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return True
    return any(_has_float(t.field(i).type) for i in range(t.num_fields))


def carryable(
    task: LLMTask, model: str, pin: dict | None, inputs: pa.Schema, memo: pa.Table
) -> str:
    """Why `memo`'s rows may not be carried into a call of `task` on `inputs`; "" when they may."""
    columns = memo_columns(task)
    lacking = [c for c in columns if c not in memo.column_names]
    if lacking:
        return f"the last run's answered rows lack {', '.join(lacking)}"
    for c in task.key_columns:
        if memo.schema.field(c).type != inputs.field(c).type:
            return f"column {c} is {inputs.field(c).type} now, {memo.schema.field(c).type} then"
        if _has_float(inputs.field(c).type):
            return f"column {c} holds floats, which compare equal where their keys differ"
    if memo.num_rows:
        first = memo.slice(0, 1).select(list(task.key_columns)).to_pylist()[0]
        if task.request_key(model, first, pin) != memo[KEY][0].as_py():
            return "the model, prompts, answer schema or pin changed since the last run"
    return ""


def match(inputs: pa.Table, memo: pa.Table, task: LLMTask) -> pa.Array:
    """Per input row, in order, the memo's request key for equal request inputs (null: none
    equal). The memo holds each key once, so each input row meets at most one memo row."""
    cols = list(task.key_columns)
    on = " AND ".join(f'i."{c}" IS NOT DISTINCT FROM m."{c}"' for c in cols)
    found = duck.query(
        f"""SELECT m.{KEY}
            FROM (SELECT *, row_number() OVER () AS _row FROM inputs) i
            LEFT JOIN memo m ON {on}
            ORDER BY i._row""",
        inputs=inputs.select(cols),
        memo=memo.select([*cols, KEY]),
    )
    return found[KEY].combine_chunks()
