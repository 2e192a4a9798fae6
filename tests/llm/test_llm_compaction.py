"""The LLM cache and ledger compacted after each stage: few objects, every row counted once.

First the folders themselves, on a local root and on the loopback S3 (no Ray): parts as askers
flush them, compacted by the root's owner only, a compaction stopped at each step, the size
bound. Then an LLM stage as a user runs it (`cpr build --stages judge-analogy` on the mined
sample, the scripted model), run twice, and stopped in the middle of its compaction."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from cpr_ray.config import load_config
from cpr_ray.errors import StorageError
from cpr_ray.llm.spend import ledger_spend
from cpr_ray.llm.spend_ledger import LEDGER, cache_uri, ledger_summary, ledger_uri, read_cache
from cpr_ray.storage import leases
from cpr_ray.storage.store import Storage, join
from cpr_ray.tables import compaction
from tests.builds import copy_build
from tests.llm.test_llm_reliability import PRICED, cpr_build, published

PRICES = ["llm.prices.judge.input_per_mtok=1000", "llm.prices.judge.output_per_mtok=2000"]
STAGE = "dedup"  # two tasks of one stage cache answers of two schemas in one folder
SAME = pa.schema([("same_problem", pa.bool_())])
CHOICE = pa.schema([("choice", pa.int64())])
PARTS = 12


def _answers(schema: pa.Schema, keys: list[str], value: object) -> pa.Table:
    rows = [
        {
            **{f.name: value for f in schema},
            **{name: None for name in LEDGER.names},
            "request_key": key,
            "status": "ok" if i % 3 else "invalid",
            "model": "judge",
            "calls": 1,
            "prompt_tokens": 100 + i,
            "completion_tokens": 10,
        }
        for i, key in enumerate(keys)
    ]
    return pa.Table.from_pylist(rows, schema=pa.schema([*schema, *LEDGER]))


def _flush(storage: Storage, run: str, parts: int = PARTS) -> list[str]:
    """`parts` flushes of two answers each, as an asker writes them (valid ones to the cache,
    all to the ledger), alternating the stage's two answer schemas; the keys written."""
    keys = []
    for n in range(parts):
        schema, value = (SAME, True) if n % 2 else (CHOICE, n)
        batch = [f"{run}-{n}-{i}" for i in range(2)]
        table = _answers(schema, batch, value)
        name = f"{run}-abcd1234-{n:05d}.parquet"
        ok = table.filter(pa.compute.equal(table["status"], "ok"))
        if ok.num_rows:
            storage.write_parquet(ok, join(cache_uri(storage, STAGE), name))
        storage.write_parquet(table.select(LEDGER.names), join(ledger_uri(storage, STAGE), name))
        keys += batch
    return keys


def _names(storage: Storage, folder: str) -> list[str]:
    return [i.base_name for i in storage.list_folder(folder)]


def _seen(storage: Storage, keys: list[str]) -> dict[str, object]:
    """What every reader of the folders sees: the ledger's summary and spend, and the cache's
    answers for `keys` under each of the stage's two schemas, in the order they are served."""
    cfg = load_config("dry-run", env={}, overrides=["llm.model=judge", *PRICES]).llm
    cache = cache_uri(storage, STAGE)
    return {
        "summary": ledger_summary(storage, cfg),
        "spend": ledger_spend(storage, cfg),
        **{
            name: read_cache(
                storage, cache, pa.array(keys), pa.schema([*schema, *LEDGER])
            ).to_pylist()
            for name, schema in (("same", SAME), ("choice", CHOICE))
        },
    }


def _compact(storage: Storage) -> None:
    for folder in (cache_uri(storage, STAGE), ledger_uri(storage, STAGE)):
        compaction.compact(storage, folder)


def test_the_owner_compacts_each_folder_into_one_part_and_readers_see_the_same(storage):
    keys = _flush(storage, "20261204T010000Z-aaaaaa")
    before = _seen(storage, keys)
    assert before["summary"][0]["rows"] == 2 * PARTS and len(before["same"]) > 0
    ledger = ledger_uri(storage, STAGE)
    # a stage run on its own, outside a build, holds no lease: it compacts nothing
    assert compaction.compact(storage, ledger) is None and len(_names(storage, ledger)) == PARTS

    with leases.owner(storage, "build"):
        _compact(storage)
        for folder in (cache_uri(storage, STAGE), ledger):
            (name,) = _names(storage, folder)
            assert compaction.COMPACTED.match(name), name
        assert _seen(storage, keys) == before

        # the next stage's parts join the compacted one (it has room), which keeps its place
        more = _flush(storage, "20261205T010000Z-bbbbbb", parts=3)
        before = _seen(storage, keys + more)
        assert before["summary"][0]["rows"] == 2 * PARTS + 6
        _compact(storage)
        (name,) = _names(storage, ledger)
        assert name.startswith("compacted-000000-")
        assert _seen(storage, keys + more) == before


@pytest.mark.parametrize("stop", ["before its part", "before its removals"])
def test_a_stopped_compaction_counts_each_row_once_and_the_next_one_finishes_it(
    storage, monkeypatch, stop
):
    keys = _flush(storage, "20261204T010000Z-aaaaaa")
    before = _seen(storage, keys)
    ledger = ledger_uri(storage, STAGE)
    breaks = "write_parquet" if stop == "before its part" else "delete_files"

    def killed(*args, **kwargs):
        raise StorageError("the process was killed here")

    with leases.owner(storage, "build"):
        with monkeypatch.context() as m:
            m.setattr(Storage, breaks, killed)
            with pytest.raises(StorageError, match="killed"):
                compaction.compact(storage, ledger)
        left = _names(storage, ledger)
        plans = [n for n in left if n.startswith(compaction.PLAN_PREFIX)]
        committed = [n for n in left if compaction.COMPACTED.match(n)]
        assert len(plans) == 1 and len(committed) == (stop == "before its removals")
        assert len(left) == PARTS + 1 + len(committed)  # every small part still there
        assert _seen(storage, keys) == before  # each ledger row once, the spend too

        _compact(storage)
        (name,) = _names(storage, ledger)
        assert compaction.COMPACTED.match(name)
        assert _seen(storage, keys) == before


def test_compacted_parts_are_bounded_in_size_and_keep_the_order_rows_were_written(
    storage, monkeypatch
):
    keys = _flush(storage, "20261204T010000Z-aaaaaa")
    ledger = ledger_uri(storage, STAGE)
    part = max(i.size for i in storage.list_folder(ledger))
    monkeypatch.setattr(compaction, "TARGET_BYTES", 4 * part)  # four small parts each
    before = _seen(storage, keys)
    with leases.owner(storage, "build"):
        _compact(storage)
        names = _names(storage, ledger)
        assert len(names) == 3 and [n[:16] for n in names] == [
            "compacted-000000",
            "compacted-000001",
            "compacted-000002",
        ]
        assert _seen(storage, keys) == before
        # full parts stay as they are; new rows go after them
        more = _flush(storage, "20261205T010000Z-bbbbbb", parts=2)
        before = _seen(storage, keys + more)
        _compact(storage)
        assert 3 <= len(_names(storage, ledger)) <= 4
        assert _seen(storage, keys + more) == before


def test_a_reader_that_listed_before_a_compaction_removed_its_parts_lists_again(
    storage, monkeypatch
):
    """`cpr stats` reading while a build compacts: the parts it listed are gone when it reads."""
    _flush(storage, "20261204T010000Z-aaaaaa")
    before = ledger_summary(storage)
    ledger = ledger_uri(storage, STAGE)
    list_folder = Storage.list_folder
    raced: list[str] = []

    def compacted_after_listing(self: Storage, uri: str):
        found = list_folder(self, uri)
        if uri == ledger and not raced:
            raced.append(uri)
            with leases.owner(storage, "build"):
                compaction.compact(storage, ledger)
        return found

    monkeypatch.setattr(Storage, "list_folder", compacted_after_listing)
    assert ledger_summary(storage) == before and raced


# -- an LLM stage, as a user runs it ---------------------------------------------------------

ONE_AT_A_TIME = ("--set", "llm.actors=1", "--set", "llm.max_in_flight=1")  # a part per answer


@pytest.fixture()
def build(sample_mined: Path, tmp_path: Path) -> Path:
    return copy_build(sample_mined, tmp_path / "build")


def _objects(root: Path) -> dict[str, int]:
    return {
        kind: len(list((root / "_llm" / kind / "judge-analogy").iterdir()))
        for kind in ("cache", "ledger")
    }


def _observed(root: Path) -> dict[str, object]:
    cfg = load_config(env={}, overrides=[f"storage.root={root}", *PRICED[1::2]])
    storage = Storage(cfg.storage)
    cached = read_cache(
        storage,
        cache_uri(storage, "judge-analogy"),
        pa.array(
            [r["request_key"] for r in _ledger_rows(storage)],
        ),
        LEDGER,
    )
    return {
        "summary": ledger_summary(storage, cfg.llm),
        "spend": ledger_spend(storage, cfg.llm),
        "cached": sorted(cached["request_key"].to_pylist()),
    }


def _ledger_rows(storage: Storage) -> list[dict]:
    return compaction.read_parts(storage, ledger_uri(storage, "judge-analogy"), LEDGER).to_pylist()


@pytest.fixture()
def watched(monkeypatch) -> list[dict]:
    """What readers saw, and the objects there were, right before and after each compaction."""
    seen: list[dict] = []
    compact_folders = compaction.compact_folders

    def watching(storage: Storage, folders: set[str]):
        root = Path(storage.root)
        seen.append({"objects": _objects(root), **_observed(root)})
        try:
            return compact_folders(storage, folders)
        finally:
            seen.append({"objects": _objects(root), **_observed(root)})

    monkeypatch.setattr(compaction, "compact_folders", watching)
    return seen


@pytest.mark.usefixtures("ray_session")
def test_an_llm_stage_run_twice_leaves_one_part_each_and_the_same_ledger(build, llm, watched):
    code, out = cpr_build(build, llm.base_url, *PRICED, *ONE_AT_A_TIME)
    assert code == 0, out
    before, after = watched
    assert before["objects"]["ledger"] == 8 and before["objects"]["cache"] >= 4  # a part each
    assert after["objects"] == {"cache": 1, "ledger": 1}
    assert {k: v for k, v in after.items() if k != "objects"} == {
        k: v for k, v in before.items() if k != "objects"
    }
    (summary,) = after["summary"]
    assert summary["rows"] == 8 and summary["calls"] == llm.stats()["total"]

    # more rows: the cache serves the first eight, the four new ones join the compacted part
    code, out = cpr_build(
        build, llm.base_url, *PRICED, *ONE_AT_A_TIME, "--set", "llm.max_rows_per_stage=12"
    )
    assert code == 0, out
    stats = published(build)["stats"]
    assert (stats["cached"], stats["asked"]) == (8, 4)
    _, _, before, after = watched
    assert before["objects"]["ledger"] == 1 + 4 and after["objects"] == {"cache": 1, "ledger": 1}
    assert {k: v for k, v in after.items() if k != "objects"} == {
        k: v for k, v in before.items() if k != "objects"
    }
    assert after["summary"][0]["rows"] == 12 == llm.stats()["total"]


@pytest.mark.usefixtures("ray_session")
def test_a_stage_stopped_mid_compaction_publishes_nothing_and_its_rerun_finishes_it(
    build, llm, watched, monkeypatch
):
    """Killed between writing the ledger's compacted part and removing the parts it covers:
    readers (the summary, the spend a cap counts, the cache) count each row once, and the rerun
    asks nothing, finishes the compaction and publishes."""
    delete_files = Storage.delete_files

    def killed(self, uris):
        if "/_llm/ledger/" in uris[0]:
            raise StorageError("the process was killed here")
        return delete_files(self, uris)

    monkeypatch.setattr(Storage, "delete_files", killed)
    code, out = cpr_build(build, llm.base_url, *PRICED, *ONE_AT_A_TIME)
    assert code == 2 and "killed here" in out, out
    assert published(build) is None
    before = watched[0]
    ledger = build / "_llm" / "ledger" / "judge-analogy"
    (plan,) = ledger.glob(f"{compaction.PLAN_PREFIX}*.json")
    covers = json.loads(plan.read_text())["covers"]
    assert len(covers) == 8 and all((ledger / name).exists() for name in covers)
    now = _observed(build)
    assert now == {k: v for k, v in before.items() if k != "objects"}
    assert now["summary"][0]["rows"] == 8

    monkeypatch.setattr(Storage, "delete_files", delete_files)
    asked = llm.stats()["total"]
    code, out = cpr_build(build, llm.base_url, *PRICED, *ONE_AT_A_TIME)
    assert code == 0, out
    assert published(build)["stats"]["asked"] == 0 and llm.stats()["total"] == asked
    assert _objects(build) == {"cache": 1, "ledger": 1}
    assert _observed(build) == now
