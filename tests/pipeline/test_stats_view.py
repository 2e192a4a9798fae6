"""`cpr stats ROOT` fits a screen: one row per stage and one line of figures per stage, never a
dump of a manifest's nested statistics; `--stage NAME` and `--json` give every figure as JSON.

The root is written by hand as a stage writes it (`ROOT/STAGE/_MANIFEST.json`), with statistics
as deep as a dry run's (per-field tables, per-pooler settings), so the test runs in a second."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from cpr_ray.cpr_command import app
from cpr_ray.pipeline.stats_view import summary_line

FIELDS = [f"field {i}" for i in range(26)]


def _manifest(stage: str, tables: dict[str, int], stats: dict[str, Any]) -> dict[str, Any]:
    return {
        "stage": stage,
        "run_id": f"20261207T120000Z-{stage[:6]}",
        "seconds": 12.5,
        "tables": {
            name: {"uri": f"/root/{stage}/runs/r/{name}.parquet", "rows": rows}
            for name, rows in tables.items()
        },
        "stats": stats,
    }


MANIFESTS = {
    "ingest": _manifest(
        "ingest",
        {"papers": 3684, "citations": 7835, "venues": 780, "rejects": 6},
        {
            "papers": 3684,
            "linked_share": 0.97,
            "openalex_snapshot": "2026-03-01",
            "by_input": {i: {"kept": 100 + n, "rejected": n} for n, i in enumerate("abcdef")},
            "per_field": {f: {"papers": 10, "with_abstract": 7} for f in FIELDS},
        },
    ),
    "mine": _manifest(
        "mine",
        {"pairs": 1264, "base_papers": 120, "universe": 973},
        {
            "pairs": 1264,
            "crossing_field_share": 0.4123456,
            "eligible_per_field": {f: 40 for f in FIELDS},
            "drawn_per_field": {f: 5 for f in FIELDS},
            "phase_seconds": {"select": 1.2, "pairs": 3.4},
        },
    ),
}


def _root(tmp_path: Path) -> Path:
    for stage, manifest in MANIFESTS.items():
        (tmp_path / stage).mkdir(parents=True)
        (tmp_path / stage / "_MANIFEST.json").write_text(json.dumps(manifest))
    return tmp_path


def _stats(*args: str, columns: int = 100) -> Any:
    return CliRunner().invoke(app, ["stats", *args], env={"COLUMNS": str(columns)})


def test_the_screen_shows_a_row_and_a_line_per_stage_and_no_dump(tmp_path):
    shown = _stats(str(_root(tmp_path)))
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert len(lines) <= 20, shown.output  # 2 stages; the old dump printed every field
    assert all(len(line) <= 100 for line in lines), shown.output
    assert "{" not in shown.output and "field 7" not in shown.output
    (ingest,) = [ln for ln in lines if ln.startswith("ingest: ")]
    assert ingest.startswith(
        "ingest: papers 3,684, linked_share 0.97, openalex_snapshot 2026-03-01"
    )
    assert ingest.endswith(" (+2 more: --stage ingest)")
    (mine,) = [ln for ln in lines if ln.startswith("mine: ")]
    assert "crossing_field_share 0.4123" in mine and mine.endswith("(+3 more: --stage mine)")
    row = next(ln for ln in lines if ln.lstrip().startswith("ingest "))
    assert "20261207T120000Z-ingest" in row and "12.5" in row
    table = " ".join(shown.output[: shown.output.index("ingest: ")].split())  # cells may wrap
    assert "papers 3,684, citations 7,835, venues 780, rejects 6" in table
    assert "/root/ingest" not in table  # where the tables went is --stage's


def test_one_stage_and_everything_come_whole_as_json(tmp_path):
    root = str(_root(tmp_path))
    one = _stats(root, "--stage", "mine")
    assert one.exit_code == 0, one.output
    assert json.loads(one.output) == MANIFESTS["mine"]
    everything = _stats(root, "--json")
    assert everything.exit_code == 0, everything.output
    assert json.loads(everything.output) == {
        "stages": MANIFESTS,
        "llm_ledger": [],
        "last_failures": [],
    }


def test_a_stage_that_does_not_exist_or_did_not_publish_is_one_line(tmp_path):
    root = str(_root(tmp_path))
    bogus = _stats(root, "--stage", "minee")
    assert bogus.exit_code == 2
    (line,) = bogus.output.strip().splitlines()
    assert line.startswith("error: --stage minee: no such stage; stages: ingest, venues, mine")
    unpublished = _stats(root, "--stage", "judge_analogy")  # a config key's spelling
    assert unpublished.exit_code == 2
    assert f"judge-analogy has published nothing under {root}" in unpublished.output
    both = _stats(root, "--watch", "--json")
    assert both.exit_code == 2 and "--watch follows a running build" in both.output


def test_a_long_line_is_cut_to_the_width_and_says_what_is_left():
    stats = {f"count_{i}": i * 1000 for i in range(40)} | {"nested": {"a": 1}}
    line = summary_line("pool", {"stats": stats}, 80)
    assert len(line) <= 80
    assert line.startswith("pool: count_0 0, count_1 1,000, ") and "…" in line
    assert line.endswith(" (+1 more: --stage pool)")
    assert summary_line("x", {"stats": {}}, 80) == "x: no plain figures"
