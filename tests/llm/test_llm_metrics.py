"""An LLM stage's live metrics, as Prometheus scrapes them from Ray's metrics endpoint.

A head started with `--metrics-export-port` (in its own process group: `ray stop` would stop
every Ray on this machine), a driver joining it that runs one scripted LLM stage (an ask through
the actor pool, then a smaller one answered by the driver itself, half of it from the cache),
then a scrape: the counters must equal the stage's ledger and its published rows. The dashboard
shipped in infra/ must query only what the code exports.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.dataset as pds
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cpr_ray.runs.prometheus import exported_names
from tests.builds import ray_head_process
from tests.standins.clients import ScriptedLLM
from tests.standins.launch import free_port

RAY = str(Path(sys.executable).parent / "ray")
DASHBOARD = Path(__file__).resolve().parents[2] / "infra" / "grafana" / "cpr-llm.json"
# metrics leave each process once a second (Ray's default: every 10 s)
FAST_METRICS = {"RAY_metrics_report_interval_ms": "1000", "RAY_AUTH_MODE": "disabled"}

# the driver: one stage that asks 16 rows through the pool (more than llm.inline_max_rows), then
# rows 12..19 (those of 12..15 answered ok come from the cache, the rest are asked by this
# process); prints the ledger and the manifest, then stays connected until told to go, so its
# last metrics reach the agent
DRIVER = textwrap.dedent(
    """
    import json, sys, time, urllib.request
    import pyarrow as pa
    import ray
    from cpr_ray.config import load_config
    from cpr_ray.llm.spend_ledger import ledger_summary
    from cpr_ray.llm.step_runner import run_llm_task
    from cpr_ray.queries.usefulness import UsefulnessGrader
    from cpr_ray.runs.stage_runner import StageOutput, run_stage
    from cpr_ray.storage.store import Storage, join

    root, url, address, metrics = sys.argv[1:]
    deadline = time.time() + 90
    while True:  # the head starts while this driver imports: its agent answers last
        try:
            urllib.request.urlopen(metrics, timeout=2)
            break
        except OSError:
            if time.time() > deadline:
                sys.exit(f"the ray head did not start: {metrics} never answered")
            time.sleep(0.3)
    ray.init(address=address)
    cfg = load_config("dry-run", env={}, overrides=[
        f"storage.root={root}", f"llm.base_url={url}", "llm.stages={}", "llm.model=scripted",
        "llm.inline_max_rows=8", "llm.max_in_flight=4", "llm.backoff_base_s=0.05",
        "llm.max_failure_rate=1", "llm.max_invalid_rate=1",
        "llm.prices.scripted.input_per_mtok=1000", "llm.prices.scripted.output_per_mtok=3000",
    ])
    storage = Storage(cfg.storage)

    def rows(start, stop):
        return pa.table({
            "query": [f"how to do thing {i}?" for i in range(start, stop)],
            "passage": ["good text"] * (stop - start),
            "mappings": ["a -> b (role)"] * (stop - start),
        })

    def grade(run):
        pooled = run_llm_task(run, UsefulnessGrader(), rows(0, 16), base_url=url)
        inline = run_llm_task(run, UsefulnessGrader(), rows(12, 20), base_url=url)
        graded = pa.concat_tables([pooled.table, inline.table])
        uri = join(run.out, "graded.parquet")
        storage.write_parquet(graded, uri)
        stats = {"pooled": pooled.stats, "inline": inline.stats}
        return StageOutput({"graded": {"uri": uri, "format": "parquet", "rows": graded.num_rows}},
                           stats)

    manifest = run_stage("grade-metrics", cfg, storage, {}, ("llm",), grade)
    print(json.dumps({"ledger": ledger_summary(storage, cfg.llm), "manifest": manifest}))
    sys.stdout.flush()
    sys.stdin.read()
    """
)


@pytest.fixture()
def metrics_head() -> Iterator[tuple[str, str]]:
    """A one-CPU head exporting metrics on a free port: (its GCS address, the metrics URL).

    Not waited for: the driver waits for it while it imports (seconds of a short test)."""
    gcs, metrics = free_port(), free_port()
    options = [f"--port={gcs}", f"--metrics-export-port={metrics}", "--include-dashboard=false"]
    options += ["--num-cpus=1", "--object-store-memory=150000000"]
    with ray_head_process("cprmet-", options, {**os.environ, **FAST_METRICS}):
        yield f"127.0.0.1:{gcs}", f"http://127.0.0.1:{metrics}/metrics"


def scrape(url: str, stage: str) -> dict[str, float]:
    """Each metric of ours summed over its series (processes) for `stage`."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    sums: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("ray_cpr_") and sample.labels.get("stage") == stage:
                sums[sample.name] += sample.value
    return dict(sums)


def test_a_stages_scraped_counters_equal_its_ledger_and_rows(
    metrics_head: tuple[str, str], llm: ScriptedLLM, tmp_path: Path
) -> None:
    address, url = metrics_head
    llm.fault_rates(seed=3, **{"500": 0.15, "invalid_json": 0.15})  # retries, invalid answers
    errors = tmp_path / "driver.log"
    with open(errors, "wb") as log:
        driver = subprocess.Popen(
            [sys.executable, "-c", DRIVER, str(tmp_path / "build"), llm.base_url, address, url],
            env={**os.environ, **FAST_METRICS, "RAY_ADDRESS": ""},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    try:
        answered, _, _ = select.select([driver.stdout], [], [], 180)
        line = driver.stdout.readline() if answered else ""
        assert line, errors.read_text()[-3000:]
        report = json.loads(line)
        (ledger,) = [s for s in report["ledger"] if s["stage"] == "score-positives"]
        manifest = report["manifest"]
        pooled, inline = manifest["stats"]["pooled"], manifest["stats"]["inline"]
        assert pooled["asked"] == 16 and 4 <= inline["asked"] <= 8  # the pool, then the driver
        assert ledger["rows"] == pooled["asked"] + inline["asked"]
        rows = pds.dataset(tmp_path / "build" / "_llm" / "ledger" / "score-positives").to_table()
        expected = {
            "ray_cpr_llm_answers_total": ledger["rows"],
            "ray_cpr_llm_requests_total": ledger["calls"],
            "ray_cpr_llm_prompt_tokens_total": ledger["prompt_tokens"],
            "ray_cpr_llm_completion_tokens_total": ledger["completion_tokens"],
            "ray_cpr_llm_invalid_total": ledger["invalid"],
            "ray_cpr_llm_failures_total": ledger["failed"],
            "ray_cpr_llm_retries_total": pc.sum(rows["retries"]).as_py(),
            "ray_cpr_llm_cache_hits_total": inline["cached"],
            "ray_cpr_llm_rows_todo": inline["asked"],  # the gauges: the last ask's, done
            "ray_cpr_llm_rows_done": inline["asked"],
            "ray_cpr_llm_in_flight": 0,
        }
        assert ledger["calls"] > ledger["rows"]  # the faults were retried or re-asked
        deadline = time.time() + 30
        while True:
            got = scrape(url, "score-positives")
            usd = got.get("ray_cpr_llm_usd_total", 0.0)
            got = {k: got.get(k, 0) for k in expected}  # a counter never incremented is absent
            matches = got == expected
            spent = usd == pytest.approx(ledger["cost_usd"], abs=1e-5)
            if (matches and spent) or time.time() > deadline:
                break
            time.sleep(1)
        assert got == expected
        assert usd == pytest.approx(ledger["cost_usd"], abs=1e-5) and usd > 0
        published = scrape(url, "grade-metrics")
        assert published == {"ray_cpr_stage_rows_total": manifest["tables"]["graded"]["rows"]}
        assert manifest["tables"]["graded"]["rows"] == 24
        # every series is tagged with the stage's model
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        assert re.search(rf'ray_cpr_llm_requests_total{{[^}}]*model="{pooled["model"]}"', text)
    finally:
        driver.stdin.close()
        driver.wait(timeout=60)


def test_the_dashboard_parses_and_queries_only_exported_metrics() -> None:
    text = DASHBOARD.read_text()
    dashboard = json.loads(text)
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(queries) >= len(dashboard["panels"]) and all(q.strip() for q in queries)
    queried = set(re.findall(r"\bray_cpr_\w+", text))  # panels and the stage picker alike
    assert queried <= exported_names(), queried - exported_names()
    assert queried == exported_names()  # and every metric the code exports has a panel
