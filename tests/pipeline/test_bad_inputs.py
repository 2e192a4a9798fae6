"""Bad input across the commands: each mistake is one `error:` line and exit code 2, at once.

A model named wrong (a typo in a folder, a hub name that cannot be fetched, an index whose model
folder has gone, a config.json with a field of the wrong type) is refused by the one guard every
model load goes through (`cpr_ray.retrieval.model_source.locate_model`), naming the setting and
how the name was read. A collection BM25 cannot index (every text stop words or one letter) is
refused by evaluation and the index; the BM25 pooler brings no candidates from it.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from cpr_ray.config import EncoderActors, StorageConfig, load_config
from cpr_ray.cpr_command import app
from cpr_ray.errors import InputError, UserError
from cpr_ray.pooling.poolers import PoolerPlan, PoolerSearch, plans
from cpr_ray.retrieval.bm25 import BM25Retriever
from cpr_ray.retrieval.encoder import DenseEncoder
from cpr_ray.retrieval.model_source import locate_model
from cpr_ray.retrieval.spec import EncoderSpec, query_identity
from cpr_ray.search.sharded_index import publish
from cpr_ray.storage.store import Storage
from tests.runs.test_cli import error_line

runner = CliRunner()
NO_HUB_MODEL = "cpr-test/no-such-model"
STOP_WORDS = ["the", "a of and", "x y z", "it is", ""]


@pytest.fixture
def files(tmp_path: Path, tiny_bert: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A BEIR folder, a triplets file, a model whose config.json has a wrong-typed field, and an
    index whose model folder has since been deleted; Ray and Serve refuse to start."""

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray started before the bad input was reported")

    monkeypatch.setattr("cpr_ray.runs.ray_runtime.ensure_ray", no_ray)
    monkeypatch.setattr("cpr_ray.search.serve.run_locally", no_ray)
    write_beir(tmp_path / "beir", ["Protein folding. We fold proteins.", "Bridges carry loads."])
    write_beir(tmp_path / "stop", STOP_WORDS)
    (tmp_path / "t.jsonl").write_text('{"query": "How to a?", "positive": "b"}\n')

    bad = tmp_path / "bad-config"
    shutil.copytree(tiny_bert, bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "num_hidden_layers": "two"}))

    gone = tmp_path / "model-since-deleted"
    shutil.copytree(tiny_bert, gone)
    docs = pa.table(
        {
            "vid": pa.array([1, 2], pa.int64()),
            "corpus_id": pa.array([1, 2], pa.int64()),
            "title": ["Protein folding", "Bridges"],
            "text": ["Protein folding. We fold proteins.", "Bridges carry loads."],
            "field": pa.array([None, None], pa.string()),
        }
    )
    vectors = np.eye(2, 32, dtype=np.float32)
    publish(
        Storage(StorageConfig()),
        str(tmp_path / "index"),
        docs,
        vectors,
        load_config(env={}).search,
        encoder=query_identity(EncoderSpec(model=str(gone))),
        source={"uri": "test", "kind": "beir"},
        generation=1,
        build={},
    )
    shutil.rmtree(gone)
    manifest = json.loads((tmp_path / "index" / "index.json").read_text())
    for name, text in (
        ("not-json", "{oops"),
        ("newer", json.dumps({**manifest, "encoder": {**manifest["encoder"], "colbert_dim": 8}})),
    ):
        shutil.copytree(tmp_path / "index", tmp_path / name)
        (tmp_path / name / "index.json").write_text(text)
    for name, line in (
        ("array", "[1, 2]"),
        ("no-id", '{"_id": null, "title": "a", "text": "protein folding"}'),
        ("object-text", '{"_id": "d1", "title": "a", "text": {"en": "protein folding"}}'),
    ):
        write_beir(tmp_path / name, ["Protein folding."])
        with open(tmp_path / name / "corpus.jsonl", "a") as f:
            f.write(line + "\n")
    return tmp_path


def write_beir(root: Path, texts: list[str]) -> None:
    (root / "qrels").mkdir(parents=True)
    lines = [json.dumps({"_id": f"d{i}", "title": "", "text": t}) for i, t in enumerate(texts)]
    (root / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    (root / "queries.jsonl").write_text('{"_id": "q1", "text": "how to fold a protein"}\n')
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td0\t1\n")


TYPO = "{tmp}/models/minilm-typo"
AS_FOLDER = "encoder.model: {tmp}/models/minilm-typo (read as a folder): no such folder"
OFFLINE = (
    f"encoder.model: '{NO_HUB_MODEL}' is no folder here, and read as a hub name it is not in the "
    "local hub cache, and HF_HUB_OFFLINE is set"
)
GONE = (
    "the model of the index {tmp}/index (index.json): {tmp}/model-since-deleted (read as a folder)"
)
CASES = {
    "index: a typo in --model": (
        ["index", "--corpus", "{tmp}/beir", "--model", TYPO, "--out", "{tmp}/idx"],
        AS_FOLDER,
    ),
    "eval: a typo in --model": (
        ["eval", "--benchmark", "beir", "--data", "{tmp}/beir", "--retriever", "dense"]
        + ["--model", TYPO, "--out", "{tmp}/eval"],
        AS_FOLDER,
    ),
    "train: a typo in --model": (
        ["train", "--data", "{tmp}/t.jsonl", "--format", "triplets", "--model", TYPO]
        + ["--out", "{tmp}/run"],
        AS_FOLDER,
    ),
    "train --plan: a typo in --model": (["train", "--plan", "--model", TYPO], AS_FOLDER),
    "index: a hub name not fetched, offline": (
        ["index", "--corpus", "{tmp}/beir", "--model", NO_HUB_MODEL, "--out", "{tmp}/idx"],
        OFFLINE,
    ),
    "search: the index's model folder is gone": (
        ["search", "{tmp}/index", "How to fold a protein?"],
        GONE + ": no such folder",
    ),
    "serve: the index's model folder is gone": (["serve", "{tmp}/index"], GONE),
    "train --plan: a config.json field of the wrong type": (
        ["train", "--plan", "--model", "{tmp}/bad-config"],
        "encoder.model: model {tmp}/bad-config cannot be loaded (Validation error for field "
        "'num_hidden_layers': TypeError: Field 'num_hidden_layers' expected int, got str",
    ),
    "search: an index.json that is not JSON": (
        ["search", "{tmp}/not-json", "How to fold a protein?"],
        "{tmp}/not-json: its index.json is not an index manifest; rebuild it with cpr index",
    ),
    "search: an index a newer version built": (
        ["search", "{tmp}/newer", "How to fold a protein?"],
        "{tmp}/newer: its index.json records an encoder this version cannot read (keys "
        "colbert_dim)",
    ),
    "eval: a BEIR corpus line that is no object": (
        ["eval", "--benchmark", "beir", "--data", "{tmp}/array", "--retriever", "bm25"],
        "{tmp}/array/corpus.jsonl line 2: not a JSON object",
    ),
    "eval: a BEIR document without an id": (
        ["eval", "--benchmark", "beir", "--data", "{tmp}/no-id", "--retriever", "bm25"],
        "{tmp}/no-id/corpus.jsonl: 1 line(s) have no _id",
    ),
    "eval: a BEIR text that is a JSON object": (
        ["eval", "--benchmark", "beir", "--data", "{tmp}/object-text", "--retriever", "bm25"],
        "{tmp}/object-text/corpus.jsonl line 2: text is a JSON dict, not text",
    ),
    "build: the transfer verifier is the analogy judge's own model": (
        ["build", "--profile", "dry-run", "--stages", "judge-transfer"]
        + ["--set", "llm.allow_same_verifier=false", "--set", "storage.root={tmp}/build"],
        "invalid config: llm.stages.judge-transfer.model: judge-transfer would ask gemma-3-270m, "
        "the analogy judge's own model; the method verifies with a second, different model",
    ),
    "eval: BM25 over a corpus of stop words": (
        ["eval", "--benchmark", "beir", "--data", "{tmp}/stop", "--retriever", "bm25"]
        + ["--out", "{tmp}/eval"],
        "BM25: none of the 5 documents has a word to index (each is empty, English stop words "
        "or one-letter tokens)",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_a_bad_input_is_one_line_at_once(case, files, monkeypatch):
    """Each of these printed a traceback (285 lines from the hub client after 21 s for the
    index's typo); now one line naming the setting, in seconds, before Ray starts."""
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    args, message = CASES[case]
    started = time.monotonic()
    result = runner.invoke(app, [a.format(tmp=files) for a in args])
    assert message.format(tmp=files) in error_line(result)
    assert time.monotonic() - started < 15


def test_a_hub_the_machine_cannot_reach_is_one_line_without_retries(monkeypatch):
    """Online but with no hub in reach, the guard asks once: the hub client's own download
    retries for ~25 s before transformers prints its traceback."""
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", "http://127.0.0.1:9")
    started = time.monotonic()
    with pytest.raises(UserError, match=r"read as a hub name the hub cannot be reached \(") as e:
        locate_model(NO_HUB_MODEL, "encoder.model")
    assert time.monotonic() - started < 5
    assert "HF_HUB_OFFLINE=1" in str(e.value) and "\n" not in str(e.value)


def test_every_load_names_its_setting(tmp_path, tiny_bert, monkeypatch):
    """A pooler's model names its pooler; a folder without config.json or a file is not taken
    for a model; a good folder and a cached hub name load."""
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    cfg = load_config(
        "dry-run",
        env={},
        overrides=[
            f"pooling.poolers=[{{name: mine, kind: dense, encoder: {{model: {tmp_path}/x}}}}]"
        ],
    )
    (plan,) = plans(cfg.pooling)
    with pytest.raises(UserError, match=r"^pooling.poolers\[0\].encoder.model \(pooler mine\): "):
        DenseEncoder(plan.spec)
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="empty \\(read as a folder\\) holds no config.json"):
        locate_model(str(tmp_path / "empty"), "encoder.model")
    with pytest.raises(UserError, match="file \\(read as a folder\\) is a file"):
        locate_model(str(tmp_path / "file"), "encoder.model")
    with pytest.raises(UserError, match="^encoder.model is empty"):
        locate_model(" ", "encoder.model")
    assert locate_model(tiny_bert, "encoder.model") == "folder"


def test_bm25_refuses_a_collection_without_words_and_scores_wordless_documents_0():
    bm25 = BM25Retriever()
    with pytest.raises(InputError, match="none of the 5 documents has a word to index"):
        bm25.index(STOP_WORDS)
    bm25.index([*STOP_WORDS, "protein folding"])
    scores = bm25.scores(["how to fold a protein", "the of"])
    assert scores[0, :5].tolist() == [0] * 5 and scores[0, 5] > 0
    assert not scores[1].any()  # a query of stop words matches nothing


def test_the_bm25_pooler_brings_no_candidates_from_papers_without_words(tmp_path):
    """A pooler over such papers scores them all 0 and so pools none (it keeps positive scores
    only); the build goes on with its other poolers. With one paper that has words, that paper
    is pooled."""
    import datetime as dt

    from cpr_ray.pooling.pool_schemas import DOCS, SEARCH_QUERIES

    def pooled(titles: list[str]) -> list[int]:
        n = len(titles)
        docs = pa.table(
            {
                "corpus_id": pa.array(range(1, n + 1), pa.int64()),
                "title": titles,
                "abstract": [""] * n,
                "date_key": [dt.date(2020, 1, 1)] * n,
                "topic_ids": [[7]] * n,
            },
            schema=DOCS,
        )
        pq.write_table(docs, tmp_path / "docs.parquet")
        plan = PoolerPlan(
            name="bm25",
            kind="bm25",
            template="{title}. {abstract}",
            spec=None,
            pool=EncoderActors(actors=1),
        )
        search = PoolerSearch(plan, StorageConfig(), str(tmp_path / "docs.parquet"), None)
        query = {
            "query_id": "q",
            "query": "how to fold a protein",
            "base_id": 100,
            "base_date": dt.date(2024, 1, 1),
            "positive_id": 101,
            "q_topics": [1],
            "p_topics": [2],
            "depth": 10,
        }
        hits = search(pa.Table.from_pylist([query], schema=SEARCH_QUERIES))
        return sorted(hits["candidate_id"].to_pylist())

    assert pooled(STOP_WORDS) == []
    assert pooled([*STOP_WORDS, "protein folding"]) == [6]


def test_a_text_longer_than_the_model_takes_is_cut_to_its_positions(tiny_bert):
    """encoder.max_length above the model's position table (train.max_length is 1,024, BERT's
    table 512; this tiny BERT's 64) failed on the first long text with a tensor-size error."""
    from cpr_ray.retrieval.encoder import Encoder

    assert Encoder.load(tiny_bert, max_length=512).max_length == 64
    encoder = DenseEncoder(EncoderSpec(model=tiny_bert, max_length=512))
    assert encoder.encode_queries(["How to fold " * 30_000]).shape == (1, 32)


def test_json_output_leaves_the_console_to_the_next_command(files):
    """`cpr search --json` sends the console to stderr for its run only: the next command run
    in the same process (a test runner's) printed into a closed stream."""
    result = runner.invoke(app, ["search", str(files / "index"), " ", "--json"])
    error_line(result)  # whatever it is, one line
    result = runner.invoke(app, ["stats", str(files / "none")])
    assert "no published stage" in error_line(result)
