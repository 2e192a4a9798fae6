"""`cpr dry-run` end to end, as a user runs it: the bundled sample, the embedded llama.cpp judge,
every stage from ingest to synthesize-queries, a few steps of training (it must train), then
BM25, MiniLM and the fine-tuned MiniLM on the fresh CPR-eval (the figures are those `cpr eval`
gives on the export); and a second run over the same folder that asks the judge nothing, trains
nothing, encodes nothing, starts no Ray and prints the same figures.

Slow (several minutes on 2 cores, plus ~6 to build llama-server on a machine's first run). The
judge's answers are most of it, so the test asks it ROWS rows a stage rather than the profile's 6:
every stage still gets rows, the third and fourth pairs share a base paper (dedup compares
them), and one positive goes to CPR-train (synthesis has an input, and training a batch).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from datasets import load_dataset

from cpr_ray.config import load_config, minilm_dir
from cpr_ray.evaluate.eval_run import run_eval
from cpr_ray.pipeline.build import STAGES
from tests.standins.launch import CPR

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
# rows per LLM stage (llm.max_rows_per_stage): a third fewer judge calls than the profile's 6,
# about 100 s of this test on 2 cores
ROWS = 4


def dry_run(out: Path, *settings: str) -> str:
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("RAY_ADDRESS", None)  # its own local Ray, as on a user's laptop
    done = subprocess.run(
        [*CPR, "dry-run", "--out", str(out)]
        + ["--set", f"llm.max_rows_per_stage={ROWS}"]
        + [arg for setting in settings for arg in ("--set", setting)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=1500,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done.stdout + done.stderr  # the stages report on stderr, the tables on stdout


def ledger_calls(out: Path) -> int:
    parts = list((out / "_llm" / "ledger").rglob("*.parquet"))
    return sum(pq.read_metadata(p).num_rows for p in parts)


def manifest(out: Path, stage: str) -> dict:
    return json.loads((out / stage / "_MANIFEST.json").read_text())


def figures(output: str) -> str:
    """The dry run's evaluation table, as printed."""
    start = output.index("CPR-eval of this dry run")
    return output[start : output.index("R@10 ranks each query's own candidates", start)]


@pytest.mark.timeout(1500)  # two whole dry runs, beside the rest of the suite
def test_the_dry_run_builds_a_dataset_and_reruns_without_calls(tmp_path):
    out = tmp_path / "dry"
    first = dry_run(out)
    assert "placeholders that mean nothing" in first  # the notice stays
    # Ray's own lines stay in its log files: nothing forwarded from a worker or actor (the
    # driver's own C++ core-worker warnings still reach its stderr, as Ray writes them)
    for noise in (
        "pid=",
        "PlacementGroupCleaner",
        "PreemptionWatcher",
        "gcs_actor_scheduler",
        "does not have any available CPUs",
        "TrainController",
    ):
        assert noise not in first, noise

    # every stage published, and rows reached every LLM stage
    for stage in STAGES:
        assert manifest(out, stage)["complete"], stage
    for stage, table in (
        ("judge-analogy", "judged"),
        ("judge-transfer", "judged"),
        ("write-queries", "judged"),
        ("score-positives", "judged"),
        ("judge-negatives", "judged"),
    ):
        assert manifest(out, stage)["tables"][table]["rows"] > 0, stage

    # the export loads with `datasets`, in the layout DESIGN.md gives
    export = Path(manifest(out, "export")["output"])
    split = {
        name: load_dataset("parquet", data_files=str(export / f"{name}.parquet"))["train"]
        for name in ("cpr-eval", "cpr-train", "corpus")
    }
    cpr_eval = split["cpr-eval"]
    assert len(cpr_eval) >= 1 and len(split["corpus"]) >= len(cpr_eval)
    assert {"query_id", "query", "positive_id"} <= set(cpr_eval.column_names)
    assert (export / "README.md").is_file() and (export / "stats.json").is_file()

    # and the evaluation of the fresh CPR-eval is printed: what `cpr eval` gives on the export
    table = first[first.index("CPR-eval of this dry run") :]
    recall = {}
    for label, retriever, model in (("BM25", "bm25", None), ("MiniLM", "dense", minilm_dir())):
        flags = {
            "eval.benchmark": "cpr",
            "eval.data": str(export),
            "eval.retriever": retriever,
            "encoder.model": model and str(model),
        }
        recall[label] = run_eval(load_config(flags=flags))["recall_at_10"]
        r10 = recall[label]["value"]
        assert re.search(rf"{label}\s*│\s*{len(cpr_eval)}\s*│\s*{r10:.3f}\s*│", table), table
    assert "corpus R@100" in table and "cpr eval --benchmark cpr-full" in table
    # a table whose random R@10 is as good as any retriever's says so, with the reason
    plumbing = " ".join(table.split())
    assert ("plumbing only:" in plumbing) == (recall["BM25"]["random"] >= 0.5), table

    # then the exported corpus is indexed and one query searched in the other fields
    assert f"{len(split['corpus'])} documents (export" in first
    assert re.search(r"\(field: [^,]+, inferred\)", first), first[-3000:]
    # hybrid (the index has both sides), and the query's own paper is not among its hits
    panel = first[first.index("search: the exported corpus indexed") :]
    assert "(hybrid rrf k=60, depth 100)" in " ".join(panel.split()), panel[:3000]
    base = cpr_eval[0]["base_corpus_id"]
    assert not re.search(rf"│\s*{base}\s*│", panel[: panel.index("try: cpr search")]), panel

    # it trains MiniLM for a few steps on 2 workers on the queries synthesized for CPR-train's
    # positives and evaluates it beside the untrained one; which positives the placeholder judge
    # leaves for CPR-train is the judge's, so the test holds the dry run to the branch its own
    # export dictates (docs/judges.md: skipped, saying so, when there is less than one batch)
    train_rows = len(split["cpr-train"])
    synthesized = manifest(out, "synthesize-queries")["tables"]["multi-query"]["rows"]
    trained = synthesized >= 4 or train_rows >= 4  # train.batch_size: 4
    assert trained == (out / "train" / "train.json").is_file()
    if trained:
        summary = json.loads((out / "train" / "train.json").read_text())
        assert 1 <= summary["steps"] <= 4 and summary["workers"] == 2  # train.max_steps: 4
        assert re.search(r"MiniLM fine-tuned\s*│\s*\d+\s*│\s*[01]\.\d{3}", table), table
        assert "training skipped" not in first
        assert len(re.findall(r"\[cpr train\] step 1/", first)) == 1  # each step line once
    else:
        skipped = f"training skipped: {synthesized} synthesized queries and {train_rows} CPR-train"
        assert skipped in first and "MiniLM fine-tuned" not in table
        assert "[cpr train]" not in first

    calls = ledger_calls(out)
    assert calls > 0
    ray_dir = tmp_path / "rerun-ray"  # where a Ray started by the rerun would keep its files
    second = dry_run(out, f"ray.temp_dir={ray_dir}")
    assert ledger_calls(out) == calls  # nothing asked again
    assert not ray_dir.exists()  # nor Ray started: every stage, the training and index are done
    assert second.count("skipped") >= len(STAGES), second[-3000:]
    assert "to ask gemma" not in second and "to ask gemma" in first
    assert ("already trained" in second) == trained
    assert re.search(r"\b0 encoded, \d+ kept from the previous index", second), second[-3000:]
    # nor evaluated again: the same export and models give the figures the first run printed
    evaluated = 3 if trained else 2
    assert second.count("kept from the previous run (same export and model)") == 2 * evaluated
    assert figures(second) == figures(first)
