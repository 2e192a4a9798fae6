"""benchmarks/scale.py's arithmetic: the ratios per doubling, the build's totals, the refresh's
share, and which goal the table says a stage misses (the measuring itself is the benchmark's)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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
                "refresh": measured(r, 350, 520 * k),  # driver doubles; share 4%, 2%, 4%
            }
        }
        for k, j, r in (
            (1, 3, 0.04 * (11 + 3)),
            (2, 9, 0.02 * (20 + 2**1.5 + 9)),
            (4, 27, 0.04 * (40 + 8 + 27)),
        )
    ]
    rows = {r["stage"]: r for r in scale.curve(sizes)}

    assert list(rows) == ["ingest", "mine", "judge", "build", "refresh"]
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
    assert rows["refresh"]["share"] == pytest.approx([0.04, 0.02, 0.04])
    assert not rows["refresh"]["share_ok"]  # 2% → 4%: the share grew
    assert not rows["refresh"]["driver_rss_ok"]

    assert scale.verdict(rows["ingest"]) == "met"
    assert scale.verdict(rows["mine"]) == "missed: wall 2.83×, cpu 2.83×, worker 2.00×"
    assert scale.verdict(rows["judge"]) == "missed: wall 3.00×"
    assert scale.verdict(rows["refresh"]).endswith("4.0 / 2.0 / 4.0% of the build (grows)")
    table = scale.markdown(list(rows.values()), [2500, 5000, 10000])
    assert "| stage | wall s (2.5k / 5k / 10k) |" in table
    assert "| mine | 1.0 / 2.8 / 8.0 | 2.83 / 2.83 | 1.0 / 2.8 / 8.0 | 2.83 / 2.83 | 300 " in table
    assert "| judge | 3.0 / 9.0 / 27.0 | 3.00 / 3.00 | 2.0 / 4.0 / 8.0 | 2.00 / 2.00 |" in table
