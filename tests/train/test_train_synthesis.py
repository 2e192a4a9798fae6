"""synthesize-queries on a (hand-made) export, through the LLM layer with the scripted endpoint:
six kinds per positive or paraphrases per query, read back as multi-query training data whose
siblings share a positive, Q-D metrics in the stats, nothing asked twice."""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import pytest

from cpr_ray.dataset.export import export
from cpr_ray.queries.synthesis import (
    MULTI_QUERY,
    QUERY_KINDS,
    synthesize_queries,
    synthesized_problems,
)
from cpr_ray.train.data import read_examples
from cpr_ray.train.examples import DataOptions
from tests.dataset.test_dataset_export import built

pytestmark = pytest.mark.usefixtures("ray_session")


def test_synthesized_sets_must_hold_different_queries():
    assert synthesized_problems(["how to a", "how to b"]) == []
    assert "the same" in synthesized_problems(["How to  A", "how to a"])[0]
    assert "word for word" in synthesized_problems(["x y", "how to a"], seed="How to a")[0]
    assert "longer than 45" in synthesized_problems(["w " * 46, "how to a"])[0]


def test_diverse_queries_become_multi_query_training_data(tmp_path, llm, minilm):
    cfg, storage, _, _ = built(
        str(tmp_path),
        f"llm.base_url={llm.base_url}",
        "llm.stages={}",
        f"synthesis.embed_model={minilm}",
    )
    train = storage.read_parquet(export(cfg, storage)["tables"]["cpr-train"]["uri"])
    m = synthesize_queries(cfg, storage)
    rows = storage.read_parquet(m["tables"]["multi-query"]["uri"])
    assert rows.schema == MULTI_QUERY
    positives = pc.unique(train["positive_id"]).to_pylist()
    assert sorted(pc.unique(rows["positive_id"]).to_pylist()) == sorted(positives)
    for pid in positives:
        mine = rows.filter(pc.equal(rows["positive_id"], pid))
        assert mine["kind"].to_pylist() == list(QUERY_KINDS)  # one query of each kind
        assert len(set(mine["query"].to_pylist())) == len(QUERY_KINDS)
        assert len(set(mine["positive"].to_pylist())) == 1
    qd = m["stats"]["qd_metrics"]
    assert qd["synthesized"]["queries"] == rows.num_rows
    assert qd["build"]["queries"] > 0 and 0 < qd["synthesized"]["dist_sim"] <= 1
    assert "ce_paraphrase_share" not in qd["synthesized"]  # no synthesis.cross_encoder

    # the training reader takes it as triplets: six queries per positive, all siblings
    examples, _ = read_examples(storage, DataOptions(format="triplets", data=rows_uri(m)))
    keys = examples["positive_key"].to_numpy()
    assert examples.num_rows == rows.num_rows
    assert sorted(np.unique(keys, return_counts=True)[1]) == [len(QUERY_KINDS)] * len(positives)

    calls = llm.stats()["total"]
    assert synthesize_queries(cfg, storage)["run_id"] == m["run_id"]  # skipped
    synthesize_queries(cfg, storage, force=True)  # forced: the cache answers
    assert llm.stats()["total"] == calls


def rows_uri(manifest: dict) -> str:
    return manifest["tables"]["multi-query"]["uri"]


def test_paraphrase_mode_rewrites_each_train_query(tmp_path, llm):
    cfg, storage, _, _ = built(
        str(tmp_path),
        f"llm.base_url={llm.base_url}",
        "llm.stages={}",
        "synthesis.mode=paraphrase",
        "synthesis.paraphrases=3",
        "synthesis.embed_model=null",
    )
    train = storage.read_parquet(export(cfg, storage)["tables"]["cpr-train"]["uri"])
    m = synthesize_queries(cfg, storage)
    rows = storage.read_parquet(rows_uri(m))
    assert rows.num_rows == 3 * train.num_rows
    assert set(rows["kind"].to_pylist()) == {"paraphrase"}
    assert sorted(pc.unique(rows["source_query_id"]).to_pylist()) == sorted(
        train["query_id"].to_pylist()
    )
    assert m["stats"]["qd_metrics"]["synthesized"]["dist_sim"] is None  # no embed_model set
