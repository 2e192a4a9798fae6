"""The model card: the renderer (front matter that parses, the Hub's fields, model-index's shape),
appending evaluations (history kept, hand edits kept, foreign cards untouched), what an export's
card and stats give it, and end to end: `cpr train` on a tiny CPR export writes the card,
`cpr eval --model` appends to it, and sentence-transformers loads the folder and applies the
saved prompts in `encode_query` / `encode_document`; evaluations racing to append to one card,
locally and on the loopback S3, keep every row."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from huggingface_hub import ModelCard
from typer.testing import CliRunner

from cpr_ray import storage as storage_module
from cpr_ray.dataset.card import dataset_card
from cpr_ray.dataset.format import CPR_TRAIN
from cpr_ray.errors import StorageError
from cpr_ray.storage import Storage, StorageConfig, join
from cpr_ray.train.model_card import (
    END,
    CardFacts,
    DataFacts,
    Evaluation,
    HardwareFacts,
    ProcedureFacts,
    add_evaluation,
    export_facts,
    record_evaluation,
    recorded,
    render_card,
    split_card,
)
from tests import tiny_models
from tests.test_evaluate_loaders import make_cpr_export

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
    assert f"(export `{EXPORT_ID}`), built 2025-06-01 12:00 UTC by cpr-ray 0.1.0" in body
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


def test_evaluations_are_appended_and_a_rerender_keeps_them():
    card = render_card(_facts()).replace("## Framework", "My own note.\n\n## Framework")
    card = add_evaluation(card, Evaluation.from_results(_results("cpr", 0.5)))
    card = add_evaluation(card, Evaluation.from_results(_results("beir", 0.3)))
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
    first = index[0]["results"][0]
    assert first["task"] == {"type": "retrieval", "name": "Retrieval (dense)"}
    assert first["dataset"] == {"name": "CPR-eval", "type": "cpr", "split": "test"}
    assert first["metrics"][0] == {"type": "ndcg_at_10", "value": 0.5, "name": "nDCG@10"}
    # the same benchmark and protocol again: a dated row of its own; model-index the latest
    again = _results("cpr", 0.6, created="2025-06-04T09:30:00+00:00")
    card = add_evaluation(card, Evaluation.from_results(again))
    rows, results = recorded(card)
    assert [r.split(" | ")[0] for r in rows] == [
        "| 2025-06-03 10:00",
        "| 2025-06-03 10:00",
        "| 2025-06-04 09:30",
    ]
    assert rows[0] == (
        "| 2025-06-03 10:00 | CPR-eval | – | dense | 300 | 0.5000 [0.400, 0.600] | 0.2500 | "
        "0.7000 | 0.4000 | 12.5 |"
    )
    assert [(r["dataset"]["type"], r["metrics"][0]["value"]) for r in results] == [
        ("beir", 0.3),
        ("cpr", 0.6),
    ]
    # another protocol (a reranker) is another entry
    reranked = Evaluation.from_results(_results("cpr", 0.7, rerank="tournament"))
    card = add_evaluation(card, reranked)
    assert len(recorded(card)[1]) == 3 and "My own note." in card  # hand edits stay
    assert card.count(END) == 1
    # rendered again (a rerun finishing the run): the rows and entries are kept as they were
    rows, results = recorded(card)
    again = render_card(_facts(), rows, results)
    assert recorded(again) == (rows, results) and len(rows) == 4


def test_a_folder_without_a_cpr_ray_card_is_left_untouched(tmp_path: Path):
    results = _results("cpr", 0.5)
    assert record_evaluation(STORAGE, "sentence-transformers/all-MiniLM-L6-v2", results) is None
    assert record_evaluation(STORAGE, None, results) is None
    bare = tmp_path / "bare"
    bare.mkdir()
    assert record_evaluation(STORAGE, str(bare), results) is None
    assert not (bare / "README.md").exists()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    text = "---\nlibrary_name: sentence-transformers\ntags:\n- sentence-transformers\n---\n# x\n"
    (foreign / "README.md").write_text(text)
    assert record_evaluation(STORAGE, str(foreign), results) is None
    assert (foreign / "README.md").read_text() == text
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "README.md").write_text(render_card(_facts(model_uri=str(ours))))
    assert record_evaluation(STORAGE, str(ours), results) == str(ours / "README.md")
    assert len(recorded((ours / "README.md").read_text())[0]) == 1


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
    (folder / "README.md").write_text(dataset_card(stats, prov, "2025-06-01 12:00 UTC"))


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


def test_cpr_train_writes_the_card_and_cpr_eval_appends_to_it(
    ray_session, minilm: str, tmp_path: Path
):
    from sentence_transformers import SentenceTransformer

    from cpr_ray.cli import app

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

    evaluate = ["eval", "--benchmark", "cpr", "--data", str(export), "--retriever", "dense"]
    evaluate += ["--model", str(model), "--out", str(tmp_path / "results")]
    for seed in ("0", "1"):
        result = cli.invoke(app, [*evaluate, "--seed", seed, "--set", "eval.resamples=200"])
        assert result.exit_code == 0, result.output
        assert f"model card → {model / 'README.md'}" in result.output
    (written,) = (tmp_path / "results").glob("*.json")
    res = json.loads(written.read_text())  # the second run's
    card = (model / "README.md").read_text()
    rows, results = recorded(card)
    assert len(rows) == 2 and all("| CPR-eval | – | dense | 8 |" in r for r in rows)
    assert len(results) == 1  # one benchmark, subset and protocol: its latest figures
    ndcg = next(m for m in results[0]["metrics"] if m["type"] == "ndcg_at_10")
    assert ndcg["value"] == round(res["ndcg_at_10"]["value"], 4)
    assert ModelCard(card).data.eval_results[0].dataset_type == "cpr"
    assert "| loss | InfoNCE" in card  # the training sections are as they were
    # a finished run is not trained again, and its card keeps the evaluations
    result = cli.invoke(app, train)
    assert result.exit_code == 0 and "already trained" in result.output, result.output
    assert (model / "README.md").read_text() == card
    assert SentenceTransformer(str(model), device="cpu").prompts["query"] == "query: "


def test_a_card_on_s3_gets_the_evaluation(s3_endpoint: str, s3_bucket: str):
    storage = Storage(StorageConfig(s3_endpoint=s3_endpoint))
    model = f"s3://{s3_bucket}/runs/r1/model"
    storage.write_text(f"{model}/README.md", render_card(_facts(model_uri=model)))
    assert record_evaluation(storage, model, _results("cpr", 0.5)) == f"{model}/README.md"
    rows, results = recorded(storage.read_text(f"{model}/README.md"))
    assert len(rows) == 1 and results[0]["dataset"]["type"] == "cpr"
    assert 'SentenceTransformer("PATH/TO/A/LOCAL/COPY")' in storage.read_text(f"{model}/README.md")
    assert record_evaluation(storage, f"s3://{s3_bucket}/none", _results("cpr", 0.5)) is None


@pytest.fixture(params=["local", "s3"])
def card_storage(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Storage, str]:
    """A storage and a model folder holding a fresh cpr-ray card, on each backend."""
    if request.param == "local":
        storage, model = STORAGE, str(tmp_path / "model")
    else:
        endpoint, bucket = (request.getfixturevalue(f) for f in ("s3_endpoint", "s3_bucket"))
        storage, model = Storage(StorageConfig(s3_endpoint=endpoint)), f"s3://{bucket}/r1/model"
    storage.write_text(join(model, "README.md"), render_card(_facts(model_uri=model)))
    return storage, model


def test_eight_evaluations_of_one_model_at_once_leave_eight_rows(card_storage):
    """A job array of 8 benchmarks: each run's `record_evaluation` starts at the same moment."""
    storage, model = card_storage
    start, written = threading.Barrier(8), []

    def evaluate(i: int) -> None:
        results = _results("beir", 0.1 + i / 100, data=f"/data/set{i}")  # subset set{i}
        start.wait()
        written.append(record_evaluation(storage, model, results))

    threads = [threading.Thread(target=evaluate, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert written == [join(model, "README.md")] * 8
    rows, results = recorded(storage.read_text(join(model, "README.md")))
    assert sorted(r.split(" | ")[2] for r in rows) == [f"set{i}" for i in range(8)]
    assert sorted(r["dataset"]["config"] for r in results) == [f"set{i}" for i in range(8)]


class LostReplies(Storage):
    """S3 when a conditional write lands but its reply is lost: the client's retry of the same
    request is refused, so the writer sees a conflict for a write of its own."""

    def __init__(self, storage: Storage, lose: int) -> None:
        super().__init__(storage.cfg)
        self.lose = lose

    def write_if(self, uri: str, data: bytes, *, tag: str | None = None) -> str | None:
        landed = super().write_if(uri, data, tag=tag)
        if self.lose:
            self.lose -= 1
            return None
        return landed


def test_a_write_that_landed_unseen_is_not_recorded_twice(card_storage):
    storage, model = card_storage
    assert record_evaluation(LostReplies(storage, 1), model, _results("cpr", 0.5))
    rows, results = recorded(storage.read_text(join(model, "README.md")))
    assert len(rows) == 1 and len(results) == 1


class Overtaken(Storage):
    """Another writer that changes the file just before each of our conditional writes."""

    def __init__(self, storage: Storage) -> None:
        super().__init__(storage.cfg)

    def write_if(self, uri: str, data: bytes, *, tag: str | None = None) -> str | None:
        self.write_text(uri, self.read_text(uri) + "\nanother writer's change\n")
        return super().write_if(uri, data, tag=tag)


def test_a_writer_that_keeps_losing_gives_up_naming_the_file(tmp_path, capsys, monkeypatch):
    storage, model = STORAGE, str(tmp_path / "model")  # the loop is the same on either backend
    uri = join(model, "README.md")
    storage.write_text(uri, render_card(_facts(model_uri=model)))
    with pytest.raises(StorageError, match=f"{uri}: changed by other writers 3 times"):
        Overtaken(storage).update_text(uri, lambda text: f"{text}ours\n", tries=3)
    assert not storage.read_text(uri).endswith("ours\n")
    # an evaluation that keeps losing says so; its results stand (written before the card)
    monkeypatch.setattr(storage_module, "UPDATE_BACKOFF_S", 0.0)
    assert record_evaluation(Overtaken(storage), model, _results("cpr", 0.5)) is None
    assert f"model card not updated: {uri}: changed by other writers" in capsys.readouterr().err
    assert recorded(storage.read_text(uri))[0] == []
