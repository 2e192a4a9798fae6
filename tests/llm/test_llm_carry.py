"""Carrying an LLM step's answered rows from its stage's last run (`cpr_ray.llm.carry`): a row is
carried only when every request input equals one the last run answered `ok`, under the same
model, prompts, answer schema and pin; anything else is keyed against the cache as before.
(`tests/corpus/test_refresh.py` checks a real refresh against keying every row.)"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from cpr_ray.config import load_config
from cpr_ray.llm.carry import carryable, match, memo_columns, memo_folder, previous, remember
from cpr_ray.llm.task import KEY
from cpr_ray.queries.judges import AnalogyJudge
from cpr_ray.runs.stage_runner import StageRun, write_manifest
from cpr_ray.storage.store import Storage

MODEL = "judge"


def pairs(n: int) -> pa.Table:
    """`n` pairs as the analogy judge reads them (texts, a null topic, a list of contexts)."""
    return pa.table(
        {
            "base_id": pa.array(range(n), pa.int64()),
            "cited_id": pa.array(range(100, 100 + n), pa.int64()),
            "q_title": [f"query paper {i}" for i in range(n)],
            "q_abstract": [f"how to sort {i} items" for i in range(n)],
            "q_topic": [None if i % 2 else "Sorting" for i in range(n)],
            "d_title": [f"cited paper {i}" for i in range(n)],
            "d_abstract": [f"a heap of {i}" for i in range(n)],
            "d_topic": ["Heaps"] * n,
            "contexts": [[f"as in [{i}]", "see also"] if i % 3 else None for i in range(n)],
        }
    )


def answered(task: AnalogyJudge, table: pa.Table, status: list[str]) -> pa.Table:
    """`table` as a step joins it with its answers (keys from the task itself; answers null)."""
    keys = [task.request_key(MODEL, r) for r in table.to_pylist()]
    out = table.append_column(KEY, pa.array(keys, pa.string()))
    for column in memo_columns(task):
        if column not in out.column_names:
            values = status if column == "status" else None
            out = out.append_column(column, pa.array(values or [None] * out.num_rows))
    return out


def test_a_row_is_carried_only_when_every_request_input_equals_an_answered_one():
    task = AnalogyJudge()
    memo = answered(task, pairs(6), ["ok"] * 6)
    rows = pairs(6).take([5, 4, 3, 2, 1, 0, 0]).to_pylist()  # another order, a duplicate
    rows[1]["d_abstract"] += " (revised)"  # a changed text
    rows[2]["contexts"] = ["see also", "as in [3]"]  # the same contexts in another order
    rows[3]["q_topic"] = None  # a topic then, none now
    inputs = pa.Table.from_pylist(rows, memo.select(pairs(1).column_names).schema)
    found = match(inputs, memo, task).to_pylist()
    assert [k is None for k in found] == [False, True, True, True, False, False, False]
    for key, row in zip(found, rows, strict=True):  # each carried key is the row's own key
        assert key is None or key == task.request_key(MODEL, row)


def test_another_model_pin_or_column_type_keys_every_row():
    task = AnalogyJudge()
    inputs = pairs(3)
    memo = answered(task, inputs, ["ok"] * 3)
    assert carryable(task, MODEL, None, inputs.schema, memo) == ""
    changed = "the model, prompts, answer schema or pin changed since the last run"
    assert carryable(task, "another", None, inputs.schema, memo) == changed
    assert carryable(task, MODEL, {"transferable": True}, inputs.schema, memo) == changed
    narrow = inputs.schema.set(0, pa.field("base_id", pa.int32()))
    assert carryable(task, MODEL, None, narrow, memo) == "column base_id is int32 now, int64 then"
    scores = inputs.schema.set(2, pa.field("q_title", pa.float64()))
    memo = memo.set_column(2, "q_title", pa.array([0.0, -0.0, 1.0]))
    assert "floats" in carryable(task, MODEL, None, scores, memo)  # -0.0 = 0.0, keys differ


def test_a_run_carries_its_stages_last_ok_answers_and_says_why_when_it_cannot(tmp_path: Path):
    task, root = AnalogyJudge(), tmp_path / "root"
    cfg = load_config("dry-run", env={}, overrides=[f"storage.root={root}"])
    storage = Storage(cfg.storage)
    last = str(root / task.stage / "runs" / "r1")

    def run(incremental: bool = True) -> StageRun:
        refresh = cfg.refresh.model_copy(update={"incremental": incremental})
        folder = str(root / task.stage / "runs" / "r2")
        return StageRun(
            task.stage, "r2", folder, cfg.model_copy(update={"refresh": refresh}), storage
        )

    inputs = pairs(4)
    assert previous(run(), task, MODEL, None, inputs.schema).reason == "no earlier run"
    # the last run answered three rows ok, one failed; two calls (rounds) answered one key twice
    joined = answered(task, inputs, ["ok", "ok", "failed", "ok"])
    remember(storage, last, task, "r1-a", joined)
    remember(storage, last, task, "r1-b", joined.slice(0, 1))
    write_manifest(storage, {"stage": task.stage, "run_id": "r1", "output": last})
    carry = previous(run(), task, MODEL, None, inputs.schema)
    assert carry.memo is not None and carry.reason == ""
    assert sorted(carry.memo["base_id"].to_pylist()) == [0, 1, 3]  # ok rows, each key once
    ok = joined.take([0, 1, 3])
    assert carry.memo.sort_by("base_id").select(ok.column_names).equals(ok)
    off = previous(run(incremental=False), task, MODEL, None, inputs.schema)
    assert (off.memo, off.reason) == (None, "refresh.incremental is false")
    other = previous(run(), task, "another", None, inputs.schema)
    assert other.memo is None and "model" in other.reason
    (Path(memo_folder(last, task)) / "r1-c.arrows").write_bytes(b"not arrow")  # a bad part
    broken = previous(run(), task, MODEL, None, inputs.schema)
    assert broken.memo is None and broken.reason.startswith("the last run's answered rows are ")
