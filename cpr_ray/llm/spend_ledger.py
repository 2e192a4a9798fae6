"""Where an LLM step's answers and what they cost are kept, per stage under ROOT/_llm/.

The cache holds valid answers by request key; the ledger holds every answer's status, tokens and
latency. Both are written in small Parquet parts as answers arrive, and after each stage the
root's owner compacts a stage's parts into a few (`compaction`): rows are never changed, and every
read goes through `read_parts`, which counts each row once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.config import LLMConfig
from cpr_ray.llm.reserve import Gate
from cpr_ray.llm.spend import cost_usd, fleet_spend
from cpr_ray.llm.task import KEY, LLMTask
from cpr_ray.storage.store import Storage, StorageConfig, join
from cpr_ray.tables.compaction import read_parts

LEDGER = pa.schema(
    [
        (KEY, pa.string()),
        ("status", pa.string()),
        ("error", pa.string()),
        ("model", pa.string()),
        ("prompt_version", pa.string()),
        ("calls", pa.int32()),
        ("retries", pa.int32()),
        ("reasks", pa.int32()),
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("latency_s", pa.float64()),
        # of prompt_tokens, what the endpoint served from its prompt cache (parts written before
        # this column read it as null: none cached)
        ("cached_prompt_tokens", pa.int64()),
        # the asker (run, call and actor) that asked: its row settles its reservations
        # (`spend.in_doubt`); null in parts written before reservations
        ("asker", pa.string()),
    ]
)


def result_schema(task: LLMTask) -> pa.Schema:
    return pa.schema(list(task.output_schema) + list(LEDGER))


@dataclass(frozen=True)
class AnswerSink:
    """Where an actor appends answers as they arrive (picklable: it travels to the actors)."""

    storage: StorageConfig
    cache: str
    ledger: str
    tag: str  # unique per call of run_llm_task
    # the stage's budget, when a cap applies: each request reserves its worst case from it
    gate: Gate | None = None


def read_cache(storage: Storage, uri: str, keys: pa.Array, schema: pa.Schema) -> pa.Table:
    # parts written before only valid answers were cached may hold invalid ones: never serve them
    valid = pc.field(KEY).isin(keys) & (pc.field("status") == "ok")
    return read_parts(storage, uri, schema, filter=valid)


def cache_uri(storage: Storage, stage: str) -> str:
    return join(storage.root, "_llm", "cache", stage)


def ledger_uri(storage: Storage, stage: str) -> str:
    """A stage's ledger (and, beside it, its cache): parts named by run, call and actor, each
    written once, so any number of runs append at once and a read merges the parts; no file
    here has two writers (a compaction, by the root's owner, writes new files)."""
    return join(storage.root, "_llm", "ledger", stage)


def first_per_key(table: pa.Table) -> pa.Table:
    if table.num_rows == 0:
        return table
    idx = pa.array(range(table.num_rows), pa.int64())
    firsts = (
        pa.table({KEY: table[KEY], "_i": idx}).group_by(KEY).aggregate([("_i", "min")])["_i_min"]
    )
    return table.take(pc.take(firsts, pc.sort_indices(firsts)))  # first rows, in table order


def ledger_summary(storage: Storage, cfg: LLMConfig | None = None) -> list[dict[str, Any]]:
    """Per LLM stage, over every run: rows asked, HTTP calls, outcomes, tokens, cost, and the
    fleet's node-hours charged to it (`llm.fleet`)."""
    out = []
    root = join(storage.root, "_llm", "ledger")
    for stage_dir in storage.list_dirs(root):
        t = read_parts(storage, stage_dir, LEDGER)
        status = t["status"]
        out.append(
            {
                "stage": stage_dir.rsplit("/", 1)[1],
                "rows": t.num_rows,
                "calls": int(pc.sum(t["calls"]).as_py() or 0),
                "ok": int(pc.sum(pc.equal(status, "ok")).as_py() or 0),
                "invalid": int(pc.sum(pc.equal(status, "invalid")).as_py() or 0),
                "failed": int(pc.sum(pc.equal(status, "failed")).as_py() or 0),
                "prompt_tokens": int(pc.sum(t["prompt_tokens"]).as_py() or 0),
                "completion_tokens": int(pc.sum(t["completion_tokens"]).as_py() or 0),
                "cached_prompt_tokens": int(pc.sum(t["cached_prompt_tokens"]).as_py() or 0),
                "cost_usd": cost_usd(cfg, t) if cfg is not None else None,
                "fleet_usd": round(fleet_spend(storage, stage_dir.rsplit("/", 1)[1]), 6),
            }
        )
    return out


def write_failures(storage: Storage, table: pa.Table, uri: str) -> int:
    failures = table.filter(pc.not_equal(table["status"], "ok"))
    if failures.num_rows:
        storage.write_parquet(failures, uri)
    return failures.num_rows
