"""The same LLM path against a real local server: llama.cpp with the Gemma 3 270M GGUF.

Slow on first use on a machine: llama-server is built once from the llama-cpp-python sources
(~6 minutes on 2 cores) and cached in ~/.cache/cpr-ray. The model is a base model that follows
no instruction: what these tests show is that the constrained schemas, enforced by llama.cpp's
grammar, keep even its answers inside the decision rules.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pyarrow as pa
import pytest

from cpr_ray.config import load_config
from cpr_ray.llm.local_server import BUILD_FLAVOUR, MODEL_ALIAS, local_server
from cpr_ray.llm.step_runner import run_llm_task
from cpr_ray.llm.task import without_answer_columns
from cpr_ray.queries.judges import AnalogyJudge, TransferVerifier
from cpr_ray.queries.usefulness import UsefulnessGrader
from cpr_ray.queries.writing import QueryWriter, WrittenQuery, query_rule_violations
from cpr_ray.runs.stage_runner import StageRun
from cpr_ray.storage.store import Storage

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_session")]
# rules about words (meta-language, method phrases) that no pattern can exclude: the writer's
# review loop answers those, and the base model may well break them
AFTER_ARRIVAL_ONLY = ("contains meta-language", "names a method")


@pytest.mark.parametrize("inline_max_rows", [256, 0], ids=["from-the-driver", "actor-pool"])
def test_schema_valid_rows_from_llama_cpp(tmp_path, inline_max_rows):
    """Two rows through both ways a stage asks: the driver's own client and an actor pool."""
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
        cfg = _cfg(tmp_path, url, f"llm.inline_max_rows={inline_max_rows}")
        run = StageRun("t", "r1", str(tmp_path / "out"), cfg, Storage(cfg.storage))
        out = run_llm_task(run, UsefulnessGrader(), rows, base_url=url)
    table = out.table.to_pylist()
    assert len(table) == 2
    # every row: the schema leaves the model no invalid answer, and re-asks cover a truncation
    assert [r["status"] for r in table] == ["ok", "ok"], [r["error"] for r in table]
    for r in table:
        assert r["usefulness"] in (0, 1, 2, 3)  # the score alone: no reasoning field
        assert r["model"] == MODEL_ALIAS and r["completion_tokens"] > 0


PAIRS = pa.Table.from_pylist(
    [
        {
            "base_id": 1,
            "cited_id": 101,
            "q_title": "Denoising diffusion models for image synthesis",
            "q_abstract": "We generate images by learning to reverse a gradual noising process "
            "that turns the data distribution into a simple Gaussian.",
            "q_topic": "Generative models",
            "contexts": ["Following [3], we destroy structure with a slow Markov chain."],
            "d_title": "Nonequilibrium thermodynamics of driven systems",
            "d_abstract": "A system is moved from an initial equilibrium state to a final one by a "
            "slow protocol; we relate the work done to the free energy difference.",
            "d_topic": "Statistical physics",
        },
        {
            "base_id": 2,
            "cited_id": 202,
            "q_title": "Energy-aware duty cycling for sensor networks",
            "q_abstract": "Battery-free sensor nodes must decide when to wake their radios so "
            "that harvested energy is never exhausted.",
            "q_topic": "Wireless sensor networks",
            "contexts": ["Like the foraging model of [7], a node spends only what it gathers."],
            "d_title": "Optimal foraging under uncertain food supply",
            "d_abstract": "Animals balance the energy they gain against the energy they spend "
            "searching; we derive when to stop foraging a patch.",
            "d_topic": "Behavioral ecology",
        },
    ]
)


def _cfg(tmp_path, url: str, *overrides: str):
    """The dry run's LLM settings without its pins: what the schemas alone make of the model."""
    return load_config(
        "dry-run",
        env={},
        overrides=[
            f"storage.root={tmp_path}",
            f"llm.base_url={url}",
            f"llm.model={MODEL_ALIAS}",
            *overrides,
        ],
        unpin_for_endpoint=True,
    )


def test_constrained_answers_of_the_base_model_pass_the_rule_checks(tmp_path):
    """Judge-analogy answers, transfer verdicts and a written query from Gemma under the
    constrained schemas come back `ok`: consistent with the decision rules, checked after arrival
    as always. Prints how long a call takes (2 shared cores here: timings vary widely)."""
    with local_server(parallel=2) as url:
        cfg = _cfg(tmp_path, url, "llm.max_reasks=1")
        assert cfg.llm.response_format == "json_schema"

        # one pair, one `LLMClient.ask` with the judgment's schema and `analogy_problems` as its
        # check (`AnalogyJudge.run`): the model's ~220-token answer is most of this test's time
        run = StageRun("t", "r1", str(tmp_path / "out"), cfg, Storage(cfg.storage))
        start = time.perf_counter()
        judged = run_llm_task(run, AnalogyJudge(), PAIRS.slice(0, 1), base_url=url)
        seconds = time.perf_counter() - start
        rows = judged.table.to_pylist()
        decisions = [r["decision"] for r in rows]
        print(f"judge-analogy, {len(rows)} call: {seconds:.1f} s ({decisions})")
        assert [r["status"] for r in rows] == ["ok"], [r["error"] for r in rows]
        for r in rows:
            assert r["decision"] == r["model_decision"]  # the model's decision is the derived one
        # the second judge reads the first judgment, whatever it was: verdict and reason agree
        verified = run_llm_task(
            run, TransferVerifier(), without_answer_columns(judged.table), base_url=url
        )
        verdicts = verified.table.to_pylist()
        assert [r["status"] for r in verdicts] == ["ok"], [r["error"] for r in verdicts]
        for r in verdicts:
            assert (r["verdict"] == "transfer") == (r["reject_reason"] is None)

        writing = PAIRS.select(["base_id", "cited_id", "q_title", "q_abstract", "contexts"])
        path = {
            "from_d": "the slow noising chain of d",
            "through_mappings": "images map to the physical system's states",
            "helps_q": "q generates images by reversing the chain",
        }
        writing = writing.append_column("transfer_path", pa.array([path] * 2)).append_column(
            "d_fields", pa.array(["Physics", "Biology"])
        )
        start = time.perf_counter()
        written = run_llm_task(run, QueryWriter(), writing.slice(0, 1), base_url=url)
        print(f"one write-queries row (3 calls or more): {time.perf_counter() - start:.1f} s")
    row = written.table.to_pylist()[0]
    assert row["status"] == "ok", row["error"]
    WrittenQuery.model_validate({"query": row["written_query"]})  # the pattern held
    assert [
        v
        for v in query_rule_violations(row["written_query"])
        if not v.startswith(AFTER_ARRIVAL_ONLY)
    ] == []


def _need_the_server(cache: str, builds: str, at_lock, found) -> None:
    """One process needing llama-server, in a cache with none: `server_binary`'s own lookup and
    lock, with the ~6 minute compile replaced by a file write that leaves a line in `builds`.
    Both callers meet at `at_lock` just before taking the lock, so neither can find the other's
    binary before it: the lock alone must keep the second from building."""
    import fcntl

    from cpr_ray.llm import local_server as ls

    os.environ.pop("CPR_LLAMA_SERVER", None)
    ls.CACHE = Path(cache)
    ls.shutil.which = lambda name: None  # none on PATH
    take_lock = fcntl.flock

    def flock(fd, op) -> None:
        at_lock.wait(timeout=60)
        take_lock(fd, op)

    def build(target: Path) -> Path:
        with open(builds, "a") as log:
            log.write(f"{target}\n")
        target.write_bytes(b"binary")
        return target

    ls.fcntl.flock, ls._build = flock, build
    found.put(str(ls.server_binary()))


def test_two_processes_needing_the_server_build_it_once(tmp_path):
    """`server_binary` builds under a file lock: of two processes that both found no binary,
    one builds and the other waits, then finds the binary the first built."""
    ctx = multiprocessing.get_context("spawn")  # no fork of a process running Ray
    at_lock, found = ctx.Barrier(2), ctx.Queue()
    builds = tmp_path / "builds"
    callers = [
        ctx.Process(target=_need_the_server, args=(str(tmp_path), str(builds), at_lock, found))
        for _ in range(2)
    ]
    for p in callers:
        p.start()
    for p in callers:
        p.join(timeout=120)
    assert [p.exitcode for p in callers] == [0, 0]
    paths = {Path(found.get(timeout=5)) for _ in callers}
    built = builds.read_text().splitlines()
    assert len(built) == 1 and paths == {Path(built[0])}, (built, paths)
    assert Path(built[0]).parent.name.endswith(BUILD_FLAVOUR)  # never a native build's cache
