"""The model card: the renderer (front matter that parses, the Hub's fields, model-index's shape),
its evaluations (history kept, hand edits kept, foreign cards untouched), what an export's card
and stats give it, and end to end: `cpr train` on a tiny CPR export writes the card, `cpr eval
--model` and `jobs/evaluate.py` each add a row (printing the same lines), and sentence-transformers
loads the folder and applies the saved prompts in `encode_query` / `encode_document`. The ledger
itself (concurrent writers, a card of the previous version) is tests/cards/test_card_ledger.py."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from huggingface_hub import ModelCard
from typer.testing import CliRunner

from cpr_ray.cards import evaluations as ledger
from cpr_ray.cards.dataset_card import dataset_card
from cpr_ray.cards.model_card import (
    BEGIN,
    END,
    CardFacts,
    DataFacts,
    Evaluation,
    HardwareFacts,
    ProcedureFacts,
    render_card,
    split_card,
    with_evaluations,
)
from cpr_ray.dataset.format import CPR_TRAIN, EXPORT_FILES
from cpr_ray.storage.store import Storage, StorageConfig
from cpr_ray.train.card_facts import export_facts
from tests import tiny_models
from tests.evaluate.test_evaluate_loaders import make_cpr_export

STORAGE = Storage(StorageConfig())
EXPORT_ID = "20250601T120000Z-abc123"


def _facts(**over) -> CardFacts:
    values = dict(
        name="Qwen3-Embedding-0.6B fine-tuned on CPR-train",
        model_uri="/runs/r1/model",
        base_model="Qwen/Qwen3-Embedding-0.6B",
        base_model_id="Qwen/Qwen3-Embedding-0.6B",
        pooling="last_token",
        max_length=1024,
        dim=1024,
        similarity="cosine",
        query_prompt="Instruct: find papers\nQuery: ",
        document_prompt="",
        data=DataFacts(
            format="cpr",
            uri=f"s3://b/export/runs/{EXPORT_ID}",
            table="cpr-train",
            export_id=EXPORT_ID,
            built="2025-06-01 12:00 UTC by cpr-ray 0.1.0",
            release="Semantic Scholar release 2025-05-20",
            counts=(("pairs trained on (query, positive)", 1200), ("distinct queries", 1100)),
            provenance=(("stage judge-analogy", "run r7, model gpt-x, prompt v3"),),
        ),
        procedure=ProcedureFacts(
            temperature=0.05,
            batch_size=128,
            workers=4,
            hard_negatives_max=9,
            hard_negatives_mean=8.5,
            chunk_size=64,
            lr=6e-6,
            warmup_steps=0,
            min_lr_ratio=0.0,
            betas=(0.9, 0.95),
            eps=1e-8,
            weight_decay=0.1,
            max_grad_norm=1.0,
            epochs=1,
            steps=10,
            seed=42,
            strategy="fsdp",
            lora={"r": 16, "alpha": 32.0},
            bf16=True,
            final={"loss": 0.4, "accuracy": 0.9},
        ),
        hardware=HardwareFacts(
            workers=4,
            cpus_per_worker=1,
            gpus_per_worker=1,
            seconds=3723.4,
            peak_memory_mb=(30000.0, 29000.0, 29500.0, 29900.0),
            device="NVIDIA H100 80GB HBM3",
        ),
        versions=(("cpr-ray", "0.1.0"), ("torch", "2.13.0")),
        created="2025-06-02 08:00 UTC",
        language="en",
    )
    return CardFacts(**{**values, **over})


def _results(benchmark: str, ndcg: float, **over) -> dict:
    block = {"value": ndcg, "ci_low": ndcg - 0.1, "ci_high": ndcg + 0.1}
    return {
        "benchmark": benchmark,
        "subset": None,
        "variant": "full",
        "data": "/data/scifact" if benchmark == "beir" else "/data/export",
        "retriever": "dense",
        "rerank": None,
        "rewrite": None,
        "n_queries": 300,
        "ndcg_at_10": block,
        "recall_at_1": {"value": 0.25},
        "recall_at_10": {"value": 0.7},
        "mrr_at_10": {"value": 0.4},
        "timing": {"total_s": 12.5},
        "created": "2025-06-03T10:00:00+00:00",
        **over,
    }


def record(storage: Storage, model: str | None, results: dict) -> str | None:
    """What the publisher does with a run's results for the model's card."""
    return ledger.record(storage, model, Evaluation.from_results(results))


def rows(card: str) -> list[str]:
    """The evaluation table's rows of a card."""
    table = card.split(BEGIN, 1)[1].split(END, 1)[0].strip().splitlines()
    return table[2:]


def model_index(card: str) -> list[dict]:
    return (split_card(card)[0].get("model-index") or [{}])[0].get("results") or []


def test_card_front_matter_has_the_hub_fields_and_the_body_its_sections():
    text = render_card(_facts())
    meta, body = split_card(text)
    assert meta == ModelCard(text).data.to_dict()  # the Hub's own parser reads the same
    assert meta["base_model"] == "Qwen/Qwen3-Embedding-0.6B"
    assert meta["library_name"] == "sentence-transformers"
    assert meta["pipeline_tag"] == "sentence-similarity"
    assert meta["tags"] == [
        "sentence-transformers",
        "feature-extraction",
        "sentence-similarity",
        "cpr-ray",
        "infonce",
    ]
    assert meta["datasets"] == [EXPORT_ID] and meta["language"] == ["en"]
    assert "license" not in meta and "model-index" not in meta  # unknown; no evaluation yet
    for section in (
        "## Model description",
        "## Usage",
        "## Training data",
        "## Training procedure",
        "## Hardware and time",
        "## Evaluation",
        "## Framework versions",
    ):
        assert section in body
    assert '| Query prompt | `"Instruct: find papers\\nQuery: "` |' in body  # exact, one line
    assert "| Document prompt | none |" in body and "model.encode_query(" in body
    assert (
        f"The `cpr-train` split of the CPR dataset export `s3://b/export/runs/{EXPORT_ID}` "
        f"(export `{EXPORT_ID}`), built 2025-06-01 12:00 UTC by cpr-ray 0.1.0."
    ) in body
    assert "| pairs trained on (query, positive) | 1,200 |" in body
    assert "- stage judge-analogy: run r7, model gpt-x, prompt v3" in body
    assert "| loss | InfoNCE, temperature 0.05 (scale 20) |" in body
    assert "gathered across the 4 workers" in body and "up to 9 hard negative(s)" in body
    assert "| gradient cache | chunks of 64 texts" in body
    assert "| LoRA | r 16, alpha 32.0 (merged into the weights) |" in body
    assert "| per worker | 1 CPU(s), 1 GPU |" in body and "NVIDIA H100" in body
    assert "3,723.4 s (1h 02m 03s)" in body and "30,000 MiB, 29,000 MiB" in body
    assert "- torch: 2.13.0" in body
    # a local base model and a triplets file: no hub id, no dataset id, no language
    local = _facts(
        base_model_id=None,
        base_model="/models/tiny",
        data=DataFacts(format="triplets", uri="/data/train.jsonl"),
        language=None,
        license="apache-2.0",
    )
    meta, body = split_card(render_card(local))
    assert {"base_model", "datasets", "language"}.isdisjoint(meta) and meta[
        "license"
    ] == "apache-2.0"
    assert "`train.jsonl` (format `triplets`), at `/data/train.jsonl`." in body


def test_evaluations_are_rows_in_order_and_model_index_the_latest_of_each():
    card = render_card(_facts()).replace("## Framework", "My own note.\n\n## Framework")
    first = [Evaluation.from_results(_results(b, v)) for b, v in (("cpr", 0.5), ("beir", 0.3))]
    card = with_evaluations(card, first)
    data = ModelCard(card).data
    assert [
        (r.dataset_type, r.dataset_config, r.metric_type, r.metric_value)
        for r in data.eval_results
        if r.metric_type == "ndcg_at_10"
    ] == [
        ("cpr", None, "ndcg_at_10", 0.5),
        ("beir", "scifact", "ndcg_at_10", 0.3),
    ]
    index = yaml.safe_load(card.split("---\n")[1])["model-index"]
    assert index[0]["name"] == "Qwen3-Embedding-0.6B fine-tuned on CPR-train"
    entry = index[0]["results"][0]
    assert entry["task"] == {"type": "retrieval", "name": "Retrieval (dense)"}
    assert entry["dataset"] == {"name": "CPR-eval", "type": "cpr", "split": "test"}
    assert entry["metrics"][0] == {"type": "ndcg_at_10", "value": 0.5, "name": "nDCG@10"}
    # the same benchmark and protocol again: a dated row of its own; model-index the latest
    again = Evaluation.from_results(_results("cpr", 0.6, created="2025-06-04T09:30:00+00:00"))
    card = with_evaluations(card, [*first, again])
    assert [r.split(" | ")[0] for r in rows(card)] == [
        "| 2025-06-03 10:00",
        "| 2025-06-03 10:00",
        "| 2025-06-04 09:30",
    ]
    assert rows(card)[0] == (
        "| 2025-06-03 10:00 | CPR-eval | – | dense | 300 | 0.5000 [0.400, 0.600] | 0.2500 | "
        "0.7000 | 0.4000 | 12.5 |"
    )
    assert [(r["dataset"]["type"], r["metrics"][0]["value"]) for r in model_index(card)] == [
        ("beir", 0.3),
        ("cpr", 0.6),
    ]
    # another protocol (a reranker) is another entry
    reranked = Evaluation.from_results(_results("cpr", 0.7, rerank="tournament"))
    evaluations = [*first, again, reranked]
    card = with_evaluations(card, evaluations)
    assert len(model_index(card)) == 3 and "My own note." in card  # hand edits stay
    assert card.count(END) == 1 and len(rows(card)) == 4
    # rendered again (a rerun finishing the run) from the same evaluations: the same card
    assert with_evaluations(card, evaluations) == card
    fresh = render_card(_facts(), evaluations)
    assert rows(fresh) == rows(card) and model_index(fresh) == model_index(card)


def test_a_folder_without_a_cpr_ray_card_is_left_untouched(tmp_path: Path):
    results = _results("cpr", 0.5)
    assert record(STORAGE, "sentence-transformers/all-MiniLM-L6-v2", results) is None
    assert record(STORAGE, None, results) is None
    bare = tmp_path / "bare"
    bare.mkdir()
    assert record(STORAGE, str(bare), results) is None
    assert not (bare / "README.md").exists() and not (bare / ledger.LEDGER).exists()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    text = "---\nlibrary_name: sentence-transformers\ntags:\n- sentence-transformers\n---\n# x\n"
    (foreign / "README.md").write_text(text)
    assert record(STORAGE, str(foreign), results) is None
    assert (foreign / "README.md").read_text() == text and not (foreign / ledger.LEDGER).exists()
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "README.md").write_text(render_card(_facts(model_uri=str(ours))))
    assert record(STORAGE, str(ours), results) == str(ours / "README.md")
    assert len(rows((ours / "README.md").read_text())) == 1
    assert len(json.loads((ours / ledger.LEDGER).read_text())["evaluations"]) == 1


def _export_card(folder: Path, train_queries: int) -> None:
    """The export's stats.json and README.md, as the export stage writes them."""
    split = {
        "queries": train_queries,
        "base_papers": 1,
        "positives": train_queries,
        "negatives": train_queries,
        "negatives_per_query_mean": 1.0,
        "negatives_per_query_min": 1,
        "queries_short_of_negatives": train_queries,
        "per_field": {"F": train_queries},
        "per_domain": {"Life Sciences": train_queries},
        "share_crosses_field": 1.0,
        "share_crosses_domain": 0.5,
    }
    stats = {
        "splits": {"cpr-eval": split, "cpr-train": split},
        "held_out_queries": 0,
        "share_crosses_field": 1.0,
        "share_crosses_domain": 0.5,
        "corpus": {
            "papers": 40,
            "abstracts_included": 30,
            "abstracts_withheld": 2,
            "without_abstract": 8,
        },
    }
    prov = {
        "s2": "s3://s2/2025-05-20",
        "openalex": "s3://openalex",
        "openalex_snapshot": "openalex updated_date<=2025-06-01",
        "s2_releases": "release 2025-05-20 (bulk 2025-05-20)",
        "input_fingerprints": {"papers": "f1"},
        "stages": {"judge-analogy": {"run_id": "r7", "model": "gpt-x", "prompt_version": "v3"}},
        "pooling": {"poolers": [], "top_k": 300},
        "open_licenses": ["CC-BY"],
        "config_hash": "h42",
        "config_sections": ["dataset"],
        "code_version": "0.1.0+abc",
    }
    (folder / "stats.json").write_text(json.dumps({**stats, "provenance": prov}))
    card = dataset_card(stats, prov, "2025-06-01 12:00 UTC", EXPORT_FILES)
    (folder / "README.md").write_text(card)


def test_export_facts_come_from_its_card_and_stats(tmp_path: Path):
    folder = tmp_path / "export" / "runs" / EXPORT_ID
    folder.mkdir(parents=True)
    _export_card(folder, 8)
    facts = export_facts(STORAGE, str(folder))
    assert facts.export_id == EXPORT_ID
    assert facts.built == "2025-06-01 12:00 UTC by cpr-ray 0.1.0+abc"
    assert facts.release == (
        "Semantic Scholar release 2025-05-20 (bulk 2025-05-20); "
        "OpenAlex topics openalex updated_date<=2025-06-01"
    )
    assert ("export: cpr-train queries", 8) in facts.counts
    assert ("export: corpus papers", 40) in facts.counts
    assert ("stage judge-analogy", "run r7, model gpt-x, prompt v3") in facts.provenance
    # a hand-made export (no card, no stats, a folder of any name): no id, nothing invented
    bare = export_facts(STORAGE, str(tmp_path))
    assert (bare.export_id, bare.built, bare.counts, bare.provenance) == (None, None, (), ())


def training_export(root: Path) -> Path:
    """A tiny export named as the export stage names its run folder: CPR-eval (8 queries, 7
    candidates each), CPR-train (the same 8 queries, one hard negative each), corpus, card."""
    folder = root / "export" / "runs" / EXPORT_ID
    made = make_cpr_export(folder, n_queries=8, per_group=2)
    rows = [
        {
            "query_id": r["query_id"],
            "query": r["query"],
            "base_corpus_id": r["base_corpus_id"],
            "positive_id": r["positive_id"],
            "negative_ids": [r["candidate_ids"][1]],
            "field": r["field"],
            "domain": r["domain"],
        }
        for r in made["rows"]
    ]
    pq.write_table(pa.Table.from_pylist(rows, schema=CPR_TRAIN), folder / "cpr-train.parquet")
    _export_card(folder, len(rows))
    return folder


def _evaluate_job():
    """jobs/evaluate.py as `ray job submit` runs it (its `main`)."""
    path = Path(__file__).resolve().parents[2] / "jobs" / "evaluate.py"
    spec = importlib.util.spec_from_file_location("evaluate_job", path)
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    return job


def _after_table(output: str) -> list[str]:
    """What an evaluation printed after its table: its summary line, then where it wrote."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("cpr dense: "))
    return [line for line in lines[start:] if line.strip()]


def test_cpr_train_writes_the_card_and_each_evaluation_adds_its_row(
    ray_session, minilm: str, tmp_path: Path, capsys: pytest.CaptureFixture
):
    from sentence_transformers import SentenceTransformer

    from cpr_ray.cpr_command import app

    export = training_export(tmp_path)
    tiny = tiny_models.tiny_bert(minilm, tmp_path / "tiny-bert", dropout=0.0)
    out = tmp_path / "run"
    train = ["train", "--data", str(export), "--format", "cpr", "--model", tiny]
    train += ["--out", str(out)]
    for key in (
        "train.batch_size=4",
        "train.chunk_size=4",
        "train.max_length=32",
        "train.max_steps=1",
        "train.lr=1e-3",
        'encoder.query_prefix="query: "',
        "tracking.enabled=true",  # into MLflow's default store beside the run's outputs
    ):
        train += ["--set", key]
    cli = CliRunner()
    result = cli.invoke(app, train)
    assert result.exit_code == 0, result.output
    model = out / "model"
    card = (model / "README.md").read_text()
    hub = ModelCard.load(model / "README.md")
    assert hub.data.library_name == "sentence-transformers"
    assert "cpr-ray" in hub.data.tags and hub.data.datasets == [EXPORT_ID]
    assert hub.data.base_model is None  # a local folder is no hub id
    assert f"(export `{EXPORT_ID}`), built 2025-06-01 12:00 UTC by cpr-ray 0.1.0+abc" in card
    assert "| pairs trained on (query, positive) | 8 |" in card
    assert "| distinct queries | 8 |" in card and "| export: cpr-train queries | 8 |" in card
    assert "- stage judge-analogy: run r7, model gpt-x, prompt v3" in card
    assert "| loss | InfoNCE, temperature 0.05 (scale 20) |" in card
    assert "up to 1 hard negative(s) per query" in card
    assert "| epochs, steps | 1 epoch(s), 1 optimiser step(s) |" in card
    assert "| workers | 1 |" in card and "| device | CPU (" in card
    assert "| wall time of the run |" in card and " MiB |" in card
    assert '| Query prompt | `"query: "` |' in card
    assert "| Pooling | mean |" in card and "| Output dimension | 32 |" in card
    assert "- sentence-transformers: " in card and "- ray: " in card
    # sentence-transformers loads the folder and applies the saved prompts
    st = SentenceTransformer(str(model), device="cpu")
    texts = ["how to cool a turbine blade", "riblets cut drag"]
    plain = st.encode(texts)
    np.testing.assert_allclose(st.encode_query(texts), st.encode(texts, prompt="query: "))
    assert not np.allclose(st.encode_query(texts), plain)
    np.testing.assert_allclose(st.encode_document(texts), plain)  # no document prompt

    # the same evaluation by `cpr eval` and by the job: each adds a row, both print the same
    flags = ["--benchmark", "cpr", "--data", str(export), "--retriever", "dense"]
    flags += ["--model", str(model), "--out", str(tmp_path / "results")]
    flags += ["--seed", "0", "--set", "eval.resamples=200", "--set", "tracking.enabled=true"]
    result = cli.invoke(app, ["eval", *flags])
    assert result.exit_code == 0, result.output
    by_cli = _after_table(result.output)
    capsys.readouterr()
    assert _evaluate_job().main(flags) == 0
    assert _after_table(capsys.readouterr().out) == by_cli
    (written,) = (tmp_path / "results").glob("*.json")
    (mteb,) = (tmp_path / "results" / "_mteb").rglob("CPREval.json")
    assert by_cli[1:] == [
        f"results → {written}",
        f"MTEB format → {mteb}",
        f"model card → {model / 'README.md'}",
    ]
    res = json.loads(written.read_text())  # the job's
    card = (model / "README.md").read_text()
    assert len(rows(card)) == 2 and all("| CPR-eval | – | dense | 8 |" in r for r in rows(card))
    (entry,) = model_index(card)  # one benchmark, subset and protocol: its latest figures
    ndcg = next(m for m in entry["metrics"] if m["type"] == "ndcg_at_10")
    assert ndcg["value"] == round(res["ndcg_at_10"]["value"], 4)
    kept = json.loads((model / ledger.LEDGER).read_text())["evaluations"]
    assert [e["results"] for e in kept] == [str(written)] * 2 and kept[0]["id"] != kept[1]["id"]
    assert ModelCard(card).data.eval_results[0].dataset_type == "cpr"
    assert "| loss | InfoNCE" in card  # the training sections are as they were
    _assert_one_mlflow_run(out, model, res, written)
    # a finished run is not trained again, and its card keeps the evaluations
    result = cli.invoke(app, train)
    assert result.exit_code == 0 and "already trained" in result.output, result.output
    assert (model / "README.md").read_text() == card
    assert SentenceTransformer(str(model), device="cpu").prompts["query"] == "query: "


def _assert_one_mlflow_run(out: Path, model: Path, res: dict, written: Path) -> None:
    """The training and its evaluations are one MLflow run, as MLflow's own client reads it
    from the default store beside the run's outputs; the card names it."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{out / 'mlruns.db'}"
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("cpr-ray").experiment_id])
    assert yaml.safe_load((model / "README.md").read_text().split("---")[1])["mlflow"] == {
        "uri": uri,
        "run_id": run.info.run_id,
    }
    params = run.data.params
    assert params["train.batch_size"] == "4" and params["encoder.query_prefix"] == "query: "
    assert params["workers"] == "1" and params["strategy"] == "ddp"
    assert params["data.export_id"] == EXPORT_ID and len(params["data.fingerprint"]) == 16
    assert params["data.pairs trained on query positive"] == "8"
    losses = client.get_metric_history(run.info.run_id, "loss")
    assert [m.step for m in losses] == [1]  # train.max_steps=1
    assert {"accuracy", "lr", "pairs_per_s", "peak_memory_mb/worker_0"} <= set(run.data.metrics)
    ndcg = res["ndcg_at_10"]
    for key in ("value", "ci_low", "ci_high", "random"):
        name = "eval/cpr/ndcg_at_10" + ("" if key == "value" else f"/{key}")
        assert run.data.metrics[name] == pytest.approx(ndcg[key])
    assert run.data.metrics["eval/cpr/n_queries"] == 8
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert artifacts == {"model", "eval"}
    model_files = {a.path for a in client.list_artifacts(run.info.run_id, "model")}
    assert {"model/README.md", "model/config.json"} <= model_files
    (results,) = [
        a.path
        for a in client.list_artifacts(run.info.run_id, "eval/cpr")
        if a.path.endswith(written.name)
    ]
    assert run.info.status == "FINISHED"
