"""`cpr to-beir`: an export as BEIR files that BEIR's own format readers accept, and on which
`cpr eval --benchmark beir` equals `--benchmark cpr-full` on the export, although queries share
base papers (which BEIR's "a document with the query's id" rule cannot exclude)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from cpr_ray.config import load_config
from cpr_ray.cpr_command import app
from cpr_ray.evaluate.eval_run import run_eval
from cpr_ray.evaluate.ir_metrics import METRICS
from tests.evaluate.test_evaluate_loaders import make_cpr_export


def _export_with_shared_base_papers(root: Path) -> dict:
    """The loaders' small export, with each pair of queries written from one base paper that
    repeats both queries' rare keywords: unexcluded, it would outrank their positives."""
    made = make_cpr_export(root, n_queries=8, per_group=6, bad=True)
    rows, corpus = made["rows"], made["corpus"]
    good = [r for r in rows if not r["query_id"].startswith("bad")]
    for pair in range(0, len(good), 2):
        base = 9000 + pair
        keys = " ".join(f"keyword{q}" for q in (pair, pair + 1))  # the queries' rare words
        corpus.append(
            {
                "corpus_id": base,
                "title": keys,
                "abstract": f"{keys} {keys}",
                "abstract_license": "CC-BY",
                "year": 2019,
                "field": "F",
                "domain": good[pair]["domain"],
            }
        )
        for r in good[pair : pair + 2]:
            r["base_corpus_id"] = base
    pq.write_table(pa.Table.from_pylist(corpus), root / "corpus.parquet")
    eval_file = root / "cpr-eval" / "part-0.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(eval_file)), eval_file)
    train = [
        {
            "query_id": f"t{i}",
            "query": f"train query {i}",
            "base_corpus_id": 9000,
            "positive_id": good[i]["positive_id"],
            "negative_ids": [],
            "field": "F",
            "domain": good[i]["domain"],
        }
        for i in range(3)
    ]
    pq.write_table(pa.Table.from_pylist(train), root / "cpr-train.parquet")
    return {"good": good, "corpus": corpus}


def _eval(benchmark: str, data: Path) -> dict:
    cfg = load_config(
        flags={"eval.benchmark": benchmark, "eval.data": str(data), "eval.retriever": "bm25"},
        env={},
    )
    return run_eval(cfg)


def test_beir_files_evaluate_as_cpr_full(tmp_path: Path):
    export, out = tmp_path / "export", tmp_path / "beir"
    made = _export_with_shared_base_papers(export)
    result = CliRunner().invoke(app, ["to-beir", str(export), str(out)])
    assert result.exit_code == 0, result.output
    n_docs, n_eval = len(made["corpus"]), len(made["good"])
    assert (
        f"{n_docs} documents, {n_eval} test and 3 train queries; 3 eval record(s) rejected"
        in " ".join(result.output.split())
    )

    # BEIR's layout: what BEIR's GenericDataLoader reads (_id/title/text, _id/text, a header)
    docs = [json.loads(line) for line in (out / "corpus.jsonl").read_text().splitlines()]
    assert [d["_id"] for d in docs] == sorted(
        (str(c["corpus_id"]) for c in made["corpus"]), key=int
    )
    withheld = next(d for d in docs if d["metadata"]["abstract_withheld"])
    assert withheld["text"] == "" and withheld["title"]
    queries = {
        q["_id"]: q for q in map(json.loads, (out / "queries.jsonl").read_text().splitlines())
    }
    assert len(queries) == n_eval + 3
    first = made["good"][0]
    assert queries[first["query_id"]]["text"] == first["query"]
    assert queries[first["query_id"]]["metadata"]["excluded_ids"] == [str(first["base_corpus_id"])]
    with open(out / "qrels" / "test.tsv") as f:
        qrels = list(csv.reader(f, delimiter="\t"))
    assert qrels[0] == ["query-id", "corpus-id", "score"]
    assert sorted(qrels[1:]) == sorted(
        [r["query_id"], str(r["positive_id"]), "1"] for r in made["good"]
    )
    assert len((out / "qrels" / "train.tsv").read_text().splitlines()) == 1 + 3

    full, beir = _eval("cpr-full", export), _eval("beir", out)
    assert beir["n_queries"] == full["n_queries"] == n_eval
    assert beir["n_candidates_mean"] == full["n_candidates_mean"] == n_docs - 1
    for metric in METRICS:
        assert beir[metric]["value"] == pytest.approx(full[metric]["value"], abs=1e-9), metric

    # the exclusion is what makes them equal: without it each base paper outranks its positive
    for q in queries.values():
        q.pop("metadata")
    (out / "queries.jsonl").write_text("\n".join(json.dumps(q) for q in queries.values()))
    unexcluded = _eval("beir", out)
    assert full["recall_at_1"]["value"] == 1.0
    assert unexcluded["recall_at_1"]["value"] == 0.0


def test_a_missing_export_is_one_line(tmp_path: Path):
    result = CliRunner().invoke(app, ["to-beir", str(tmp_path / "nope"), str(tmp_path / "out")])
    assert result.exit_code != 0
    assert "is not a CPR export" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()
