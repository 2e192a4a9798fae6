"""The positive-collection stages end to end on the bundled sample, with the scripted endpoint
(the build through them is the session's `sample_positives`; reruns work on a copy)."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from cpr_ray.config import load_config
from cpr_ray.cpr_command import app
from cpr_ray.errors import ConfigError
from cpr_ray.pipeline.build import run_build
from cpr_ray.storage.store import Storage
from tests.builds import LLM_STAGES, TO_POSITIVES, copy_build, scripted_config

pytestmark = pytest.mark.usefixtures("ray_session")


def test_sample_build_through_every_llm_stage_then_zero_calls(sample_positives, tmp_path, llm):
    root = copy_build(sample_positives, tmp_path / "build")
    cfg = scripted_config(root, llm)
    manifests = run_build(cfg, TO_POSITIVES)  # published by the shared build: all skipped
    assert llm.stats().get("total", 0) == 0
    stats = {name: manifests[name]["stats"] for name in LLM_STAGES}
    assert stats["judge-analogy"]["rows_in"] == 12
    assert stats["judge-analogy"]["decisions"]["observed_analogy"] == 12
    # real abstracts hold no instruction-like text: nothing is flagged, nothing held out
    judge = stats["judge-analogy"]
    assert (judge["flagged_inputs"], judge["held_out_flagged"]) == (0, 0)
    assert stats["judge-transfer"]["rows_out"] == 12
    assert stats["write-queries"]["rows_out"] == 12 and stats["write-queries"]["mean_query_words"]
    # the scripted model calls queries of one base paper the same problem: one kept per base
    bases = len(
        {
            r["base_id"]
            for r in pq.read_table(
                manifests["write-queries"]["tables"]["queries"]["uri"]
            ).to_pylist()
        }
    )
    assert stats["dedup"]["rows_out"] == bases
    positives = pq.read_table(manifests["score-positives"]["tables"]["positives"]["uri"])
    assert positives.num_rows == bases and set(positives["usefulness"].to_pylist()) == {3}
    row = positives.to_pylist()[0]
    assert row["query"].startswith("How to ") and row["decision"] == "observed_analogy"
    assert row["model_decision"] == "observed_analogy" and row["input_flags"] == []
    assert row["model"] == "scripted"
    assert row["prompt_version"] == "usefulness.v2+usefulness_reference.v1"
    assert stats["score-positives"]["failures"] == 0
    calls = llm.stats().get("total", 0)

    again = run_build(cfg, LLM_STAGES, force=True)
    assert llm.stats().get("total", 0) == calls  # an identical rerun pays for nothing
    assert all(again[s]["stats"]["asked"] == 0 for s in LLM_STAGES)
    assert all(again[s]["stats"]["cached"] == again[s]["stats"]["rows"] for s in LLM_STAGES)

    result = CliRunner().invoke(app, ["stats", str(root)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "LLM ledger" in result.output and "judge-analogy" in result.output


def test_llm_stage_without_endpoint_says_how_to_set_one(sample_mined, tmp_path):
    root = copy_build(sample_mined, tmp_path / "build")
    cfg = load_config("dry-run", env={}, overrides=[f"storage.root={root}"])
    with pytest.raises(ConfigError, match="llm.base_url is not set.*cpr dry-run"):
        run_build(cfg, ["judge-analogy"])
    assert Storage(cfg.storage).exists(f"{root}/mine/_MANIFEST.json")
    assert not Storage(cfg.storage).exists(f"{root}/judge-analogy/_MANIFEST.json")
