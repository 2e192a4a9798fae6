"""benchmarks/scale.py's arithmetic: the ratios per doubling, the build's totals, the refreshes'
shares of the build's CPU and their growth, and which goal the table says a stage misses (the
measuring itself is the benchmark's)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MB = 1024**2


def measured(
    seconds: float, worker_mb: float, driver_mb: float, cpu: float | None = None
) -> dict[str, float]:
    return {
        "seconds": seconds,
        "cpu_seconds": seconds if cpu is None else cpu,
        "worker_rss": worker_mb * MB,
        "driver_rss": driver_mb * MB,
        "spilled": 0,
        "objects": 3,
    }


def test_curve_ratios_totals_share_and_verdicts(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    scale = importlib.import_module("scale")
    sizes = [
        {
            "stages": {
                "ingest": measured(10 * k, 400, 500),  # linear, flat memory: every goal met
                "mine": measured(1 * k**1.5, 300 * k, 500),  # 2.83× a doubling, memory 2×
                # waits on a loaded machine: wall 3× a doubling, while its CPU seconds double
                "judge": measured(j, 200, 500, cpu=2 * k),
                # a share of the pairs: CPU 4%, 2%, 4% of the build's, 1.03× then 4.17× a doubling
                "refresh": measured(100, 350, 520 * k, cpu=r),
                # a fixed number of pairs: 1.15× a doubling, under 10% at every size
                "refresh-fixed": measured(100, 350, 520, cpu=f),
            }
        }
        for k, j, r, f in (
            (1, 3, 0.04 * 13, 1.0),
            (2, 9, 0.02 * (24 + 2**1.5), 1.15),
            (4, 27, 0.04 * 56, 1.15**2),
        )
    ]
    rows = {r["stage"]: r for r in scale.curve(sizes)}

    assert list(rows) == ["ingest", "mine", "judge", "build", "refresh", "refresh-fixed"]
    assert rows["ingest"]["seconds_ratio"] == [None, 2.0, 2.0]
    assert (rows["ingest"]["seconds_ok"], rows["ingest"]["worker_rss_ok"]) == (True, True)
    assert rows["mine"]["seconds_ratio"][1:] == pytest.approx([2**1.5, 2**1.5])
    assert (rows["mine"]["seconds_ok"], rows["mine"]["worker_rss_ok"]) == (False, False)
    # the build: stage seconds and objects summed, the largest process's peak
    assert rows["judge"]["cpu_seconds_ratio"] == [None, 2.0, 2.0]
    assert (rows["judge"]["seconds_ok"], rows["judge"]["cpu_seconds_ok"]) == (False, True)
    assert rows["build"]["seconds"] == pytest.approx([11 + 3, 20 + 2**1.5 + 9, 40 + 8 + 27])
    assert rows["build"]["cpu_seconds"] == pytest.approx([11 + 2, 20 + 2**1.5 + 4, 40 + 8 + 8])
    assert rows["build"]["worker_rss"] == [400 * MB, 600 * MB, 1200 * MB]
    assert rows["build"]["objects"] == [9, 9, 9]
    assert rows["refresh"]["share"] == pytest.approx([0.04, 0.02, 0.04])  # of the build's CPU
    assert rows["refresh"]["share_ok"]  # under 10% at every size
    assert not rows["refresh"]["growth_ok"]  # 4.17× in a doubling: over 2.2×
    assert rows["refresh-fixed"]["share_ok"] and rows["refresh-fixed"]["growth_ok"]
    assert not rows["refresh"]["driver_rss_ok"]

    assert scale.verdict(rows["ingest"]) == "met"
    assert scale.verdict(rows["mine"]) == "missed: wall 2.83×, cpu 2.83×, worker 2.00×"
    assert scale.verdict(rows["judge"]) == "missed: wall 3.00×"
    assert scale.verdict(rows["refresh"]) == (
        "4.0 / 2.0 / 4.0% of the build's CPU (≤ 10%: met); CPU ≤ 4.17× per doubling "
        "(≤ 2.2×: missed)"
    )
    assert scale.verdict(rows["refresh-fixed"]) == (
        "7.7 / 4.3 / 2.4% of the build's CPU (≤ 10%: met); CPU ≤ 1.15× per doubling (≤ 1.2×: met)"
    )
    table = scale.markdown(list(rows.values()), [2500, 5000, 10000])
    assert "| stage | wall s (2.5k / 5k / 10k) |" in table
    assert "| mine | 1.0 / 2.8 / 8.0 | 2.83 / 2.83 | 1.0 / 2.8 / 8.0 | 2.83 / 2.83 | 300 " in table
    assert "| judge | 3.0 / 9.0 / 27.0 | 3.00 / 3.00 | 2.0 / 4.0 / 8.0 | 2.00 / 2.00 |" in table


def test_parts_table_puts_each_refresh_part_beside_the_build_stage(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    scale = importlib.import_module("scale")

    def size(papers: int, k: float) -> dict:
        parts = {"apply-diffs": {"seconds": 9, "cpu_seconds": 2 * k}, "mine": {"cpu_seconds": k}}
        return {
            "papers": papers,
            "stages": {
                "mine": measured(1, 300, 500, cpu=3 * k),
                "refresh": {**measured(5, 300, 500), "parts": parts},
                "refresh-fixed": {**measured(5, 300, 500), "parts": {"mine": {"cpu_seconds": 1}}},
            },
        }

    table = scale.parts_table([size(80_000, 1), size(160_000, 2)])
    assert table.splitlines()[0] == (
        "| part | refresh CPU s (80k / 160k) | refresh-fixed CPU s (80k / 160k) | build CPU s |"
    )
    assert "| apply-diffs | 2.0 / 4.0 | – / – | – / – |" in table
    assert "| mine | 1.0 / 2.0 | 1.0 / 1.0 | 3.0 / 6.0 |" in table
