"""The `cpr` command: user errors are one line and exit code 2; stats reads a build."""

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from cpr_ray.cpr_command import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


def error_line(result: Result) -> str:
    """The one line a user's mistake prints (exit code 2, no traceback), less its `error: `."""
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0].removeprefix("error: ")


def test_build_with_bad_config_key_fails_before_work(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("profile: dry-run\ningest:\n  buckets: 4\n")
    result = runner.invoke(app, ["build", "--config", str(cfg)])
    assert result.exit_code == 2
    assert "ingest.buckets: unknown key" in result.output
    assert "Traceback" not in result.output


def test_build_with_unknown_stage(tmp_path):
    result = runner.invoke(
        app,
        [
            "build",
            "--profile",
            "dry-run",
            "--stages",
            "ingest,bogus",
            "--set",
            f"storage.root={tmp_path}",
        ],
    )
    assert result.exit_code == 2
    assert "unknown stage(s) bogus" in result.output


def test_stats_on_empty_root(tmp_path):
    result = runner.invoke(app, ["stats", str(tmp_path)])
    assert result.exit_code == 2
    assert "no published stage" in result.output


BAD_INPUTS = {
    "search: no index there": (
        ["search", "{tmp}/none", "How to fold a protein?"],
        "{tmp}/none holds no search index (no index.json): build it with cpr index",
    ),
    "serve: no index there": (
        ["serve", "{tmp}/none"],
        "{tmp}/none holds no search index (no index.json): build it with cpr index",
    ),
    "index: a malformed corpus line": (
        ["index", "--corpus", "{tmp}/corpus", "--model", "{minilm}", "--out", "{tmp}/idx"],
        "{tmp}/corpus/corpus.jsonl line 2: not valid JSON",
    ),
    "train: an unreachable S3 --out": (
        ["train", "--data", "{tmp}/t.jsonl", "--format", "triplets", "--model", "{minilm}"]
        + ["--out", "s3://cpr-unreachable/run", "--s3-endpoint", "http://127.0.0.1:9"],
        "cannot reach s3://cpr-unreachable/run/",
    ),
    "eval: no export there": (
        ["eval", "--benchmark", "cpr", "--data", "{tmp}/none", "--retriever", "bm25"],
        "{tmp}/none is not a CPR export",
    ),
    "hydrate: no export there": (
        ["hydrate", "{tmp}/none", "--s2", "{tmp}/s2"],
        "{tmp}/none is not a CPR export",
    ),
    "stats: no root there": (["stats", "{tmp}/none"], "no published stage under {tmp}/none"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_one_line_and_exit_2_before_any_work(case, tmp_path, minilm, monkeypatch):
    """What a user gets wrong most (a wrong path, a broken file, an endpoint that is not there):
    one line naming it. (A malformed training line: test_train_ray.py; a dead S2 API:
    test_refresh.py; a blank query or k out of range: test_search.py.)"""

    def no_serve(cfg):
        raise AssertionError("Serve started before the index was checked")

    monkeypatch.setattr("cpr_ray.search.serve.run_locally", no_serve)
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "corpus.jsonl").write_text('{"corpus_id": 1, "title": "a"}\n{oops\n')
    (tmp_path / "t.jsonl").write_text('{"query": "How to a?", "positive": "b"}\n')
    args, message = BAD_INPUTS[case]
    given = [a.format(tmp=tmp_path, minilm=minilm) for a in args]
    assert message.format(tmp=tmp_path) in error_line(runner.invoke(app, given))


def test_console_script_is_installed():
    """The `cpr` script the package installs (beside this interpreter), run as a user runs it."""
    script = Path(sys.executable).parent / "cpr"
    assert script.is_file(), f"{script}: not installed (pip install -e .)"
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for command in ("dry-run", "build", "refresh", "stats", "eval", "report", "train", "search"):
        assert command in out.stdout


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


def test_an_unknown_key_is_one_line_and_exit_2_for_the_job_and_for_eval(tmp_path):
    job = _run("jobs/build_dataset.py", "--profile", "dry-run", "--set", "ingest.nope=1")
    assert job.returncode == 2
    assert job.stderr.strip().splitlines() == [
        "error: invalid config: ingest.nope: unknown key; allowed here: batch_size, "
        "cpus_per_task, lance_fragment_rows, max_reject_rate, num_buckets, on_corrupt_shard, "
        "parse_buffer_mb, raw_line_limit"
    ]
    evaluation = _run(
        "-m", "cpr_ray.cpr_command", "eval", "--benchmark", "cpr", "--data", str(tmp_path),
        "--retriever", "bm25", "--set", "eval.nope=1",
    )  # fmt: skip
    assert evaluation.returncode == 2
    lines = evaluation.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: invalid config: eval.nope: unknown key")
    assert "Traceback" not in evaluation.stdout + evaluation.stderr


def test_a_bug_is_not_dressed_as_a_user_error(tmp_path, monkeypatch):
    """Only `UserError`s are one line and exit 2: a ValueError from inside is a bug's traceback."""
    import cpr_ray.cpr_command as cli

    def broken(*args, **kwargs):
        raise ValueError("an internal bug")

    monkeypatch.setattr(cli, "run_build", broken)
    result = runner.invoke(
        app, ["build", "--profile", "dry-run", "--set", f"storage.root={tmp_path}"]
    )
    assert result.exit_code == 1
    assert isinstance(result.exception, ValueError)


def test_a_commands_flags_and_its_jobs_are_one_table_typed_by_the_config():
    """`cpr eval`/`train`/`index` and their jobs take the same flags, made from one table each:
    named, typed and described by the config field they set."""
    import typer.main

    from cpr_ray.evaluate.eval_commands import EVAL_FLAGS
    from cpr_ray.runs.command_options import flag_values, job_parser
    from cpr_ray.search.search_commands import INDEX_FLAGS
    from cpr_ray.train.train_command import TRAIN_FLAGS

    commands = typer.main.get_command(app).commands
    for name, table in (("eval", EVAL_FLAGS), ("train", TRAIN_FLAGS), ("index", INDEX_FLAGS)):
        options = {o for p in commands[name].params for o in p.opts}
        parser = job_parser("doc", table, "x.y=1")
        job_options = {o for a in parser._actions for o in a.option_strings}
        assert {f.option for f in table} <= options & job_options
    top_k = next(p for p in commands["eval"].params if "--top-k" in p.opts)
    assert "eval.top_k" in top_k.help  # described by its config field
    args = job_parser("doc", EVAL_FLAGS, "x").parse_args(["--top-k", "50", "--model", "m"])
    flags = flag_values(EVAL_FLAGS, vars(args))
    assert flags["eval.top_k"] == 50 and flags["encoder.model"] == "m"
    assert flags["eval.benchmark"] is None
    bad = runner.invoke(app, ["eval", "--top-k", "many"])
    assert bad.exit_code == 2 and "Invalid value for '--top-k'" in bad.output
    bm25 = job_parser("doc", INDEX_FLAGS, "x").parse_args(["--bm25"])
    assert flag_values(INDEX_FLAGS, vars(bm25))["search.bm25"] is True


PIN_LINE = "llm.stages.judge-analogy.pin {decision: observed_analogy}"


def test_the_placeholder_pins_never_reach_another_endpoint(tmp_path):
    """`--profile dry-run` pins each judge's passing answer for the embedded placeholder: every
    entry point that would send those pins to another endpoint stops with one config line as the
    config loads (nothing written, no Ray), and `cpr dry-run --llm-base-url` drops them itself."""
    url = "http://127.0.0.1:9/v1"  # never reached
    root = tmp_path / "root"
    common = ["--profile", "dry-run", "--set", f"storage.root={root}"]
    for command in (
        ["build", *common, "--llm-base-url", url],
        ["refresh", *common, "--llm-base-url", url],
    ):
        result = runner.invoke(app, command)
        assert result.exit_code == 2, (command, result.output)
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: invalid config: llm: "), lines
        assert PIN_LINE in lines[0] and url in lines[0]
    for job in ("jobs/build_dataset.py", "jobs/refresh.py"):
        done = _run(job, *common, "--set", f"llm.base_url={url}")
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and PIN_LINE in lines[0], lines
    assert not root.exists()

    from cpr_ray.config import load_config

    dry = load_config("dry-run", env={}, overrides=[f"llm.base_url={url}"], unpin_for_endpoint=True)
    assert not any(dry.llm.pin_for(stage) for stage in dry.llm.stages)
    assert load_config("dry-run", env={}).llm.pin_for("judge-analogy")  # the placeholder's
