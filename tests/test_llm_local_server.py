"""The same LLM path against a real local server: llama.cpp with the Gemma 3 270M GGUF.

Slow on first use on a machine: llama-server is built once from the llama-cpp-python sources
(~6 minutes on 2 cores) and cached in ~/.cache/cpr-ray.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from cpr_ray.config import load_config
from cpr_ray.llm.judges import UsefulnessGrader
from cpr_ray.llm.local_server import MODEL_ALIAS, local_server
from cpr_ray.llm.runner import run_llm_task
from cpr_ray.stage import StageRun
from cpr_ray.storage import Storage

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_session")]


def test_schema_valid_rows_from_llama_cpp(tmp_path):
    rows = pa.table(
        {
            "query": [
                "how to keep a sensor network alive on harvested energy?",
                "how to estimate crop yield from sparse field samples?",
            ],
            "passage": [
                "Duty cycling schedules for energy-harvesting nodes. We schedule radios.",
                "Kriging for spatial interpolation of soil properties.",
            ],
            "mappings": ["", ""],
        }
    )
    with local_server(parallel=2) as url:
        cfg = load_config(
            "dry-run",
            env={},
            overrides=[
                f"storage.root={tmp_path}",
                f"llm.base_url={url}",
                f"llm.model={MODEL_ALIAS}",
                "llm.max_tokens=256",
            ],
        )
        run = StageRun("t", "r1", str(tmp_path / "out"), cfg, Storage(cfg.storage))
        out = run_llm_task(run, UsefulnessGrader(), rows, base_url=url)
    table = out.table.to_pylist()
    assert len(table) == 2
    answered = [r for r in table if r["status"] == "ok"]
    assert answered, [r["error"] for r in table]
    for r in answered:
        assert r["usefulness"] in (0, 1, 2, 3) and isinstance(r["usefulness_reasoning"], str)
        assert r["model"] == MODEL_ALIAS and r["completion_tokens"] > 0
