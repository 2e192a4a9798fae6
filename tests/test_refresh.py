"""The nightly refresh: S2 diffs from a loopback stand-in of the Datasets API, applied to a real
corpus built from the bundled sample, with the later stages rerun against the scripted LLM."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import lance
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from cpr_ray.config import load_config, sample_dir
from cpr_ray.corpus.refresh import refresh
from cpr_ray.corpus.s2_api import S2DatasetsClient, public_url
from cpr_ray.errors import InputError, StorageError
from cpr_ray.llm.runner import ledger_summary
from cpr_ray.pipeline import run_build
from cpr_ray.sample.diffs import make_diff
from cpr_ray.stage import read_manifest, require_manifest
from cpr_ray.storage import Storage

from .conftest import S2StandIn

OLD, NEW = "2026-11-25", "2026-12-02"
pytestmark = pytest.mark.usefixtures("ray_session")


def settings(root: Path, openalex: Path, s2: S2StandIn, llm=None) -> list[str]:
    """The dry-run profile on `root`, refreshed from the stand-in; BM25 pooling and shallow
    pools keep the (all-useful, per the scripted grader) negatives walk short."""
    return [
        f"storage.root={root}",
        f"input.openalex={openalex}",
        f"refresh.base_release={OLD}",
        f"refresh.api_url={s2.api_url}",
        "refresh.requests_per_second=50",
        "refresh.retain_versions_days=0",
        *([f"llm.base_url={llm.base_url}"] if llm else []),
        "llm.model=scripted",
        "llm.max_in_flight=8",
        "llm.max_rows_per_stage=null",
        "pooling.poolers=[{name: bm25, kind: bm25}]",
        "pooling.top_k=10",
        "pooling.top_k_short=10",
        "pooling.min_group_size=1",
        "dataset.eval_negatives_per_group=1",
        "dataset.train_negatives_per_group=1",
    ]


def config(*args, **kwargs):
    return load_config("dry-run", env={}, overrides=settings(*args, **kwargs))


def pairs_of(storage: Storage) -> set[tuple[int, int]]:
    t = pq.read_table(require_manifest(storage, "mine")["tables"]["pairs"]["uri"])
    return set(zip(t["base_id"].to_pylist(), t["cited_id"].to_pylist()))


def ledger(storage: Storage) -> dict[str, int]:
    return {r["stage"]: r["rows"] for r in ledger_summary(storage)}


def sorted_table(uri: str, keys: list[str]) -> pa.Table:
    return lance.dataset(uri).to_table().sort_by([(k, "ascending") for k in keys])


@pytest.fixture()
def openalex(tmp_path: Path) -> Path:
    """A copy of the sample's OpenAlex folder: the diff adds a newer works partition to it."""
    out = tmp_path / "openalex"
    shutil.copytree(sample_dir() / "openalex", out)
    return out


def test_client_reads_the_documented_shapes_backs_off_and_never_shows_the_key(s2_api):
    sleeps: list[float] = []
    client = S2DatasetsClient(s2_api.api_url, S2StandIn.API_KEY, sleep=sleeps.append)
    assert client.releases() == [OLD] and client.latest() == OLD
    assert len(sleeps) == 1 and 0.9 < sleeps[0] <= 1.0  # one request a second, per key
    sleeps.clear()
    client = S2DatasetsClient(s2_api.api_url, S2StandIn.API_KEY, requests_per_second=1e9,
                              sleep=sleeps.append)  # from here on, only back-off sleeps count
    (s2_api.root / "releases.json").write_text(json.dumps([OLD, NEW]))
    step = s2_api.root / "diffs" / OLD / NEW / "papers"
    step.mkdir(parents=True)
    (step / "update-00000.jsonl.gz").write_bytes(b"\x1f\x8b fake")
    s2_api.faults({"kind": "429", "retry_after": 3}, {"kind": "503"})
    [diff] = client.diffs(OLD, "latest", "papers")
    assert (diff.from_release, diff.to_release, diff.delete_files) == (OLD, NEW, ())
    # Retry-After first, then exponential
    assert [s for s in sleeps if s > 0.01] == [3.0, client.backoff_s * 2]
    assert "Signature" in diff.update_files[0] and "Signature" not in public_url(
        diff.update_files[0]
    )
    stats = s2_api.stats()
    assert stats["fault_429"] == stats["fault_503"] == 1 and stats["bad_key"] == 0

    with pytest.raises(InputError, match="HTTP 403") as refused:
        S2DatasetsClient(s2_api.api_url, "wrong-key", sleep=sleeps.append).latest()
    assert "wrong-key" not in str(refused.value)
    s2_api.faults(*[{"kind": "500"}] * 3)
    with pytest.raises(StorageError, match="HTTP 500 .* after 3 attempts"):
        S2DatasetsClient(s2_api.api_url, S2StandIn.API_KEY, max_retries=2,
                         sleep=sleeps.append).releases()


@pytest.mark.slow
def test_refresh_pays_only_for_new_and_changed_pairs_and_retracts_deleted_ones(
    tmp_path, llm, s2_api, openalex, monkeypatch
):
    monkeypatch.setenv("S2_API_KEY", S2StandIn.API_KEY)
    root = tmp_path / "build"
    cfg = config(root, openalex, s2_api, llm)
    storage = Storage(cfg.storage)
    run_build(cfg)
    before_pairs, before_ledger = pairs_of(storage), ledger(storage)
    plan = make_diff(
        sample_dir() / "s2", openalex, s2_api.root, pq.read_table(
            require_manifest(storage, "mine")["tables"]["pairs"]["uri"]),
        releases=(OLD, NEW), new=3, changed=1, deleted=1, deleted_citations=1,
        unpaired_changes=3, openalex_date="2026-12-01",
    )
    summary = refresh(cfg)

    assert (summary["from_release"], summary["to_release"]) == (OLD, NEW)
    ingest = require_manifest(storage, "ingest")
    assert ingest["corpus"]["release"] == NEW
    assert ingest["corpus"]["openalex_snapshot"] == "openalex updated_date<=2026-12-01"
    papers = lance.dataset(ingest["tables"]["papers"]["uri"]).to_table()
    ids = set(papers["corpus_id"].to_pylist())
    assert not ids & plan.deleted_papers and len(ids) == papers.num_rows  # gone, no duplicate
    new_ids = {d for _, d in plan.new_pairs}
    added = papers.filter(pc.is_in(papers["corpus_id"], pa.array(sorted(new_ids))))
    # linked through the new OpenAlex partition: topics, so they can cross fields at all
    assert added.num_rows == 3 and added["field_id"].null_count == 0
    citations = lance.dataset(ingest["tables"]["citations"]["uri"]).to_table()
    assert not set(citations["cited_id"].to_pylist()) & plan.deleted_papers

    after_pairs = pairs_of(storage)
    assert plan.new_pairs <= after_pairs and not plan.retracted_pairs & after_pairs
    # the analogy judge saw exactly the pairs it had not judged: new ones and changed texts
    fresh = (after_pairs - before_pairs) | (plan.changed_pairs & after_pairs)
    asked = ledger(storage)["judge-analogy"] - before_ledger["judge-analogy"]
    assert asked == len(fresh) == summary["llm_rows"]["judge-analogy"]

    export = read_manifest(storage, "export")
    corpus_ids = set(pq.read_table(export["tables"]["corpus"]["uri"])["corpus_id"].to_pylist())
    assert not corpus_ids & plan.deleted_papers
    card = storage.read_text(export["tables"]["card"]["uri"])
    assert f"release {NEW} (bulk {OLD}, refreshed {OLD} → {NEW})" in card

    calls = s2_api.stats()
    again = refresh(cfg)  # nothing new at S2: nothing applied, nothing asked, nothing rerun
    assert again["steps"] == [] and not any(again["llm_rows"].values())
    assert s2_api.stats()["api"] == calls["api"] + 1  # one look at the latest release
    assert s2_api.stats()["bad_key"] == 0


def test_refresh_of_an_unbuilt_root_or_without_a_base_release_says_what_to_do(
    tmp_path, s2_api, openalex
):
    with pytest.raises(StorageError, match="no corpus under .*cpr build --stages ingest"):
        refresh(config(tmp_path / "empty", openalex, s2_api))


@pytest.mark.slow
def test_a_refresh_killed_mid_step_then_rerun_ends_where_an_uninterrupted_one_does(
    tmp_path, s2_api, openalex, monkeypatch
):
    monkeypatch.setenv("S2_API_KEY", S2StandIn.API_KEY)
    roots = {name: tmp_path / name for name in ("whole", "killed")}
    cfgs = {name: config(root, openalex, s2_api) for name, root in roots.items()}
    run_build(cfgs["whole"], ["ingest", "venues", "mine"])
    run_build(cfgs["killed"], ["ingest"])
    whole, killed = (Storage(cfgs[n].storage) for n in ("whole", "killed"))
    make_diff(
        sample_dir() / "s2", openalex, s2_api.root,
        pq.read_table(require_manifest(whole, "mine")["tables"]["pairs"]["uri"]),
        releases=(OLD, NEW), new=3, changed=2, deleted=2, deleted_citations=2,
        unpaired_changes=5, openalex_date="2026-12-01",
    )
    corpus_only = cfgs["whole"].model_copy(
        update={"refresh": cfgs["whole"].refresh.model_copy(update={"downstream": False})}
    )
    refresh(corpus_only)

    # the killed one: stop it while it fetches the citation diff, the papers already upserted
    s2_api.stall("citations/update")
    env = {**os.environ, "RAY_ADDRESS": ""}
    args = [sys.executable, "-m", "cpr_ray.cli", "refresh", "--profile", "dry-run",
            "--corpus-only", *sum((["--set", s] for s in settings(roots["killed"], openalex,
                                                                 s2_api)), [])]
    log = open(tmp_path / "killed.log", "wb")
    proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.time() + 240
    while s2_api.stats().get("stalled", 0) < 1:
        assert proc.poll() is None, (tmp_path / "killed.log").read_text()
        assert time.time() < deadline, "the refresh never reached the citation diff"
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    published = read_manifest(killed, "ingest")
    papers_uri = published["tables"]["papers"]["uri"]
    assert lance.dataset(papers_uri).version > published["tables"]["papers"]["version"]
    with pytest.raises(StorageError, match="stopped before its commit; run cpr refresh again"):
        require_manifest(killed, "ingest")  # no stage reads a half-applied release

    s2_api.reset()
    resumed = refresh(cfgs["killed"].model_copy(update={"refresh": corpus_only.refresh}))
    assert resumed["restored"] and resumed["to_release"] == NEW
    done = {n: require_manifest(s, "ingest") for n, s in (("whole", whole), ("killed", killed))}
    assert done["whole"]["corpus"]["release"] == done["killed"]["corpus"]["release"] == NEW
    for name, keys in (("papers", ["corpus_id"]), ("citations", ["citing_id", "cited_id"])):
        a = sorted_table(done["whole"]["tables"][name]["uri"], keys)
        b = sorted_table(done["killed"]["tables"][name]["uri"], keys)
        assert a.num_rows == b.num_rows and a.equals(b), name
    changes = [s["changes"] for s in done["killed"]["corpus"]["applied"]]
    assert changes == [s["changes"] for s in done["whole"]["corpus"]["applied"]]
