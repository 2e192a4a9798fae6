"""The export (§3.4) in the DESIGN.md format: through S3 and back, into `datasets`, the CPR
loader and the dry run's evaluation; licences, the card, and `cpr hydrate`."""

from __future__ import annotations

import gzip
import json
import os
import re

import boto3
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from cpr_ray.config import Config, minilm_dir
from cpr_ray.cpr_command import app
from cpr_ray.dataset.export import export
from cpr_ray.dataset.format import CORPUS, CPR_EVAL, CPR_TRAIN
from cpr_ray.dataset.negatives import (
    STAGE,
    judge_negatives,
    mark_kept,
    split_fingerprint,
)
from cpr_ray.dataset.split import LeakageError, check_no_leakage
from cpr_ray.errors import ConfigError
from cpr_ray.evaluate.loaders.cpr_eval import load_cpr
from cpr_ray.runs.stage_runner import manifest_uri
from cpr_ray.storage.store import Storage, join
from tests.dataset.test_dataset_negatives import (
    build_config,
    fake_pool,
    publish_fake_build,
    scripted_walk,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # datasets: local files only
cli = CliRunner()


def publish_negatives(storage: Storage, made: dict, cfg: Config) -> pa.Table:
    """judge-negatives' output as the stage would write it, judged by the scripted rule."""
    done = scripted_walk(made, cfg)
    negatives = mark_kept(done.judged, max_usefulness=1)
    uri = join(storage.root, STAGE, "runs", "n0", "negatives.parquet")
    storage.write_parquet(negatives, uri)
    storage.write_json(
        manifest_uri(storage, STAGE),
        {
            "stage": STAGE,
            "run_id": "n0",
            "tables": {"negatives": {"uri": uri, "format": "parquet", "rows": negatives.num_rows}},
            "stats": {
                "split_fingerprint": split_fingerprint(cfg.dataset),
                "model": "scripted",
                "prompt_version": "usefulness.v2",
            },
            "complete": True,
        },
    )
    return negatives


def built(root: str, *more: str) -> tuple[Config, Storage, dict, pa.Table]:
    made = fake_pool()
    cfg = build_config(root, None, *more)
    storage = Storage(cfg.storage)
    publish_fake_build(storage, made)
    return cfg, storage, made, publish_negatives(storage, made, cfg)


def test_export_round_trip_through_s3_into_datasets_and_the_loader(
    tmp_path, s3_endpoint, s3_bucket
):
    cfg, storage, made, negatives = built(
        f"s3://{s3_bucket}/build", f"storage.s3_endpoint={s3_endpoint}"
    )
    m = export(cfg, storage)
    out = m["output"]
    assert out == join(storage.root, "export", "runs", m["run_id"])  # the published run folder
    assert set(m["tables"]) == {"cpr-eval", "cpr-train", "corpus", "card"}
    tables = {n: storage.read_parquet(m["tables"][n]["uri"]) for n in ("cpr-eval", "cpr-train")}
    corpus = storage.read_parquet(m["tables"]["corpus"]["uri"])
    assert tables["cpr-eval"].schema == CPR_EVAL and tables["cpr-train"].schema == CPR_TRAIN
    assert corpus.schema == CORPUS
    cpr_eval, cpr_train = tables["cpr-eval"], tables["cpr-train"]
    check_no_leakage(cpr_eval, cpr_train)
    assert cpr_eval.num_rows == 4 and cpr_train.num_rows == 3

    kept = negatives.filter(negatives["kept"])
    for row in cpr_eval.to_pylist():
        mine = kept.filter(pc.equal(kept["query_id"], row["query_id"])).to_pylist()
        assert row["candidate_ids"] == [row["positive_id"], *(n["candidate_id"] for n in mine)]
        assert row["candidate_groups"] == ["positive", *(n["group"] for n in mine)]
        assert len(row["candidate_ids"]) == 1 + 3 * 3
    assert all(len(r["negative_ids"]) == 3 for r in cpr_train.to_pylist())

    # abstracts only under CC-BY, CC0 or public domain; the licence column always
    papers = {p["corpus_id"]: p for p in made["papers"]}
    for row in corpus.to_pylist():
        paper = papers[row["corpus_id"]]
        assert row["abstract_license"] == paper["abstract_license"]
        open_licence = paper["abstract_license"] in ("CCBY", "PD")
        assert row["abstract"] == (paper["abstract"] if open_licence else None)
        assert row["topics"][0].keys() == {
            "id", "name", "score", "subfield_id", "field_id", "domain_id"
        }  # fmt: skip
    ids = set(corpus["corpus_id"].to_pylist())
    for row in cpr_eval.to_pylist() + cpr_train.to_pylist():
        assert {row["base_corpus_id"], row["positive_id"]} <= ids
        assert set(row.get("candidate_ids") or row.get("negative_ids")) <= ids

    bench = load_cpr(storage, out)
    assert bench.n_queries == 4 and not bench.rejects and bench.pools.shape == (4, 10)

    # the user's side: download the folder, load it with datasets
    import datasets

    local = tmp_path / "export"
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    prefix = out.removeprefix(f"s3://{s3_bucket}/")
    for obj in s3.list_objects_v2(Bucket=s3_bucket, Prefix=prefix + "/")["Contents"]:
        if obj["Key"].endswith("/"):
            continue  # a folder marker
        target = local / obj["Key"].removeprefix(prefix + "/")
        target.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(s3_bucket, obj["Key"], str(target))
    assert sorted(p.name for p in local.iterdir()) == [
        "README.md", "corpus.parquet", "cpr-eval.parquet", "cpr-train.parquet", "stats.json"
    ]  # fmt: skip
    # one table per load: the splits of one load must share their columns
    hf = str(tmp_path / "hf-cache")
    loaded = {
        n: datasets.load_dataset(
            "parquet", data_files=str(local / f"{n}.parquet"), split="train", cache_dir=hf
        )
        for n in ("cpr-eval", "cpr-train", "corpus")
    }
    assert loaded["cpr-eval"].to_list() == cpr_eval.to_pylist()
    assert loaded["cpr-train"].to_list() == cpr_train.to_pylist()
    assert loaded["corpus"].num_rows == corpus.num_rows
    assert loaded["cpr-eval"].features["candidate_ids"].feature.dtype == "int64"
    # the card's YAML header names each table as a config
    by_card = datasets.load_dataset(str(local), "cpr-eval", split="train", cache_dir=hf)
    assert by_card["query_id"] == cpr_eval["query_id"].to_pylist()

    card = (local / "README.md").read_text()
    stats = json.loads((local / "stats.json").read_text())
    assert "| cpr-eval | 4 |" in card and "79.9%" in card and "45.3%" in card
    assert "openalex updated_date<=2025-06-01" in card and "usefulness.v2" in card
    assert "cpr hydrate" in card and "No leakage" in card
    assert stats["splits"]["cpr-eval"]["per_field"] == {"Medicine": 2, "Physics": 2}
    assert stats["splits"]["cpr-eval"]["share_crosses_field"] == 0.5
    assert stats["provenance"]["stages"][STAGE]["model"] == "scripted"
    assert stats["provenance"]["openalex_snapshot"] == "openalex updated_date<=2025-06-01"
    assert stats["corpus"]["abstracts_withheld"] == corpus["abstract"].null_count


def test_a_leaking_split_is_refused_and_nothing_is_published(tmp_path, monkeypatch):
    """Export checks the tables it is about to write: a split that put an eval positive among a
    train query's negatives (a bug upstream) stops it, and a rerun is not skipped."""
    from cpr_ray.dataset import export as export_module

    cfg, storage, _, _ = built(str(tmp_path))
    honest = export_module.split_tables

    def leaking(queries, split, negatives):
        cpr_eval, cpr_train = honest(queries, split, negatives)
        leaked = [
            [*ids, cpr_eval["positive_id"][0].as_py()]
            for ids in cpr_train["negative_ids"].to_pylist()
        ]
        at = cpr_train.schema.get_field_index("negative_ids")
        return cpr_eval, cpr_train.set_column(
            at, "negative_ids", pa.array(leaked, pa.list_(pa.int64()))
        )

    monkeypatch.setattr(export_module, "split_tables", leaking)
    with pytest.raises(
        LeakageError, match=r"CPR-train leaks CPR-eval: .* eval paper\(s\) are a train negative"
    ):
        export(cfg, storage)
    assert not storage.exists(manifest_uri(storage, "export"))
    monkeypatch.setattr(export_module, "split_tables", honest)
    assert export(cfg, storage)["tables"]["cpr-train"]["rows"] == 3  # the rerun runs, and passes


def test_export_refuses_a_split_judge_negatives_did_not_judge_for(tmp_path):
    cfg, storage, _, _ = built(str(tmp_path))
    changed = cfg.model_copy(
        update={"dataset": cfg.dataset.model_copy(update={"eval_per_field": 3})}
    )
    with pytest.raises(ConfigError, match="rerun it first: cpr build --stages judge-negatives"):
        export(changed, storage)
    assert not storage.exists(manifest_uri(storage, "export"))
    # the licences are the export's own: changing them needs no new negatives
    licences = cfg.model_copy(
        update={"dataset": cfg.dataset.model_copy(update={"open_licenses": ("cc-by-nc",)})}
    )
    corpus = storage.read_parquet(export(licences, storage)["tables"]["corpus"]["uri"])
    assert set(corpus.filter(pc.is_valid(corpus["abstract"]))["abstract_license"].to_pylist()) == {
        "CCBYNC"
    }


def _shard(path, records: list[dict | str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))


def test_hydrate_fills_the_withheld_abstracts_from_the_users_s2_shards(tmp_path):
    cfg, storage, _, _ = built(str(tmp_path / "build"))
    out = export(cfg, storage)["output"]
    corpus = storage.read_parquet(join(out, "corpus.parquet"))
    withheld = corpus.filter(pc.is_null(corpus["abstract"]))["corpus_id"].to_pylist()
    first, second, *rest = withheld
    s2 = tmp_path / "s2"
    _shard(
        s2 / "abstracts" / "abstracts-0000.jsonl.gz",
        [
            {"corpusid": first, "abstract": "Old text.", "updated": "2024-01-01T00:00:00"},
            {"corpusid": 1, "abstract": "Not in the export."},
            '{"corpusid": broken',
        ]
        + [{"corpusid": c, "abstract": f"Hydrated {c}."} for c in rest],
    )
    _shard(
        s2 / "abstracts" / "abstracts-0001.jsonl.gz",
        [{"corpusid": first, "abstract": "New text.", "updated": "2025-01-01T00:00:00"}],
    )
    result = cli.invoke(app, ["hydrate", out, "--s2", str(s2)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    n = len(withheld)
    assert f"{n - 1} of {n} missing abstracts filled from 2 shard(s); 1 still missing" in (
        result.output
    )
    after = storage.read_parquet(join(out, "corpus.parquet"))
    assert after.schema == CORPUS and after["corpus_id"] == corpus["corpus_id"]
    text = dict(zip(after["corpus_id"].to_pylist(), after["abstract"].to_pylist()))
    before = dict(zip(corpus["corpus_id"].to_pylist(), corpus["abstract"].to_pylist()))
    assert text[first] == "New text." and text[second] is None  # the newest record wins
    assert all(text[c] == f"Hydrated {c}." for c in rest)
    assert all(text[c] == v for c, v in before.items() if v is not None)  # carried ones kept

    missing = cli.invoke(app, ["hydrate", str(tmp_path), "--s2", str(s2)])
    assert missing.exit_code == 2 and "is not a CPR export" in missing.output


@pytest.mark.usefixtures("ray_session")
def test_the_dry_run_evaluates_its_fresh_export(tmp_path, monkeypatch):
    """`cpr dry-run` ends with BM25 and MiniLM on the CPR-eval it built (the build itself is
    the fake one here: the stages have their own tests). Pools of more than ten candidates, so
    R@10 says something about the ranking; the table is what `cpr eval` gives on that export."""
    from cpr_ray.config import load_config
    from cpr_ray.evaluate.eval_run import run_eval
    from cpr_ray.pipeline import dry_run as dry_run_module

    exports = []

    def fake_build(cfg, force=False):
        cfg_, storage, _, _ = built(cfg.storage.root, "dataset.eval_negatives_per_group=6")
        exports.append(export(cfg_, storage))
        return {"export": exports[-1]}

    monkeypatch.setattr(dry_run_module, "run_build", fake_build)
    out = tmp_path / "dry"
    result = cli.invoke(
        app,
        ["dry-run", "--out", str(out), "--llm-base-url", "http://127.0.0.1:9/v1"],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert "CPR-eval of this dry run" in result.output
    table = result.output[result.output.index("CPR-eval of this dry run") :]
    pools = pq.read_table(exports[0]["tables"]["cpr-eval"]["uri"])["candidate_ids"].to_pylist()
    assert min(len(p) for p in pools) > 10
    for label, retriever, model in (("BM25", "bm25", None), ("MiniLM", "dense", minilm_dir())):
        row = re.search(rf"{label}\s*│\s*4\s*│\s*([0-9.]+)\s*│[^│]*│\s*([0-9.]+)\s*│", table)
        assert row, table
        r10, random = float(row.group(1)), float(row.group(2))
        assert random < 0.9  # ten of more than ten candidates
        flags = {
            "eval.benchmark": "cpr",
            "eval.data": exports[0]["output"],
            "eval.retriever": retriever,
            "encoder.model": model and str(model),
        }
        expected = run_eval(load_config(flags=flags))["recall_at_10"]
        assert r10 == round(expected["value"], 3) and random == round(expected["random"], 3)


def test_an_empty_pool_gives_an_empty_export_without_calls(tmp_path):
    """The dry run's placeholder judge often passes no pair: both stages still publish."""
    cfg = build_config(str(tmp_path))  # no LLM endpoint: nothing may be asked
    storage = Storage(cfg.storage)
    publish_fake_build(storage, {"papers": fake_pool()["papers"], "queries": [], "candidates": []})
    judged = judge_negatives(cfg, storage)
    assert judged["stats"]["judged"] == 0 and judged["stats"]["calls"] == 0
    m = export(cfg, storage)
    assert {n: t["rows"] for n, t in m["tables"].items()} == {
        "cpr-eval": 0, "cpr-train": 0, "corpus": 0, "card": 1
    }  # fmt: skip
    assert storage.read_parquet(m["tables"]["cpr-eval"]["uri"]).schema == CPR_EVAL
    assert "| cpr-eval | 0 |" in storage.read_text(m["tables"]["card"]["uri"])
