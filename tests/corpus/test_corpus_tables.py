"""Every stage reads the corpus at the version the ingest manifest pins (`corpus.tables`): a
refresh that commits while a build runs changes nothing a running stage sees."""

from __future__ import annotations

import lance
import pyarrow as pa
import pytest

from cpr_ray.corpus.tables import PinnedTable, paper_texts, papers_by_id, pinned_papers
from cpr_ray.dataset.negatives import grader_rows
from cpr_ray.errors import StorageError
from cpr_ray.runs.stage_runner import manifest_uri
from cpr_ray.storage.store import Storage, StorageConfig, join
from cpr_ray.tables.schemas import PAPERS, TOPIC, passage


def _papers(title: str) -> pa.Table:
    rows = [
        {
            "corpus_id": i,
            "title": f"{title} {i}",
            "abstract": f"abstract {i}",
            "topics": [{"id": i, "name": f"topic {i}"}],
            "field": "Physics",
        }
        for i in (1, 2, 3)
    ]
    return pa.Table.from_pylist(rows, schema=PAPERS)


def _publish(storage: Storage, uri: str, run_id: str) -> None:
    version = storage.open_lance(uri).version
    storage.write_json(
        manifest_uri(storage, "ingest"),
        {
            "stage": "ingest",
            "run_id": run_id,
            "tables": {"papers": {"uri": uri, "format": "lance", "rows": 3, "version": version}},
        },
    )


def test_a_stage_reads_the_pinned_version_while_a_later_one_exists(tmp_path):
    storage = Storage(StorageConfig(root=str(tmp_path)))
    uri = join(storage.root, "ingest", "runs", "r0", "papers.lance")
    lance.write_dataset(_papers("old"), uri)
    _publish(storage, uri, "r0")
    pinned, run_id = pinned_papers(storage)  # what a stage takes when it starts
    assert run_id == "r0" and pinned == PinnedTable(uri, 1)

    # a refresh commits a new version (and its manifest) while that stage still runs
    lance.write_dataset(_papers("new"), uri, mode="overwrite")
    _publish(storage, uri, "r0+2026-12-01+1")
    assert storage.open_lance(uri).version == 2

    ids = pa.array([3, 1], pa.int64())
    texts = paper_texts(storage, pinned, ids)
    assert sorted(texts["title"].to_pylist()) == ["old 1", "old 3"]
    assert texts["top_topic"].to_pylist() == [f"topic {i}" for i in texts["corpus_id"].to_pylist()]
    # judge-negatives grades the passages of the version it started with
    candidates = pa.table({"query_id": ["q"], "candidate_id": pa.array([2], pa.int64())})
    queries = pa.table({"query_id": ["q"], "query": ["How to x"]})
    rows = grader_rows(storage, pinned, queries, candidates)
    assert rows["passage"].to_pylist() == [passage("old 2", "abstract 2")]
    # a stage that starts after the commit reads the new version
    later, _ = pinned_papers(storage)
    assert later.version == 2
    assert papers_by_id(storage, later, ids, ["title"])["title"].to_pylist() == ["new 1", "new 3"]


def test_a_version_newer_than_the_manifest_is_refused_at_stage_start(tmp_path):
    storage = Storage(StorageConfig(root=str(tmp_path)))
    uri = join(storage.root, "ingest", "runs", "r0", "papers.lance")
    lance.write_dataset(_papers("old"), uri)
    _publish(storage, uri, "r0")
    lance.write_dataset(_papers("half-applied"), uri, mode="overwrite")  # no commit followed
    with pytest.raises(StorageError, match="a refresh stopped before its commit"):
        pinned_papers(storage)


def test_the_judged_pooled_trained_and_searched_text_of_a_paper_is_one_string(tmp_path):
    """Titles ending in ?, empty and null parts: every stage's paper text is the same string."""
    from cpr_ray.config import PoolerConfig
    from cpr_ray.pooling.pool_rules import doc_text
    from cpr_ray.queries.synthesis import multi_query_rows
    from cpr_ray.retrieval.base import document_texts
    from cpr_ray.search.documents import load_documents
    from cpr_ray.tables.schemas import passage, passages
    from cpr_ray.train.data import read_examples
    from cpr_ray.train.examples import DataOptions

    titles = ["Heat flow in graphs", "Can spins relax?", "", None, "Only a title"]
    abstracts = ["We map heat.", "Yes.", "Abstract alone.", "No title.", None]
    expected = [
        "Heat flow in graphs. We map heat.",
        "Can spins relax? Yes.",
        "Abstract alone.",
        "No title.",
        "Only a title",
    ]
    t, a = pa.array(titles, pa.string()), pa.array(abstracts, pa.string())
    assert passages(t, a).to_pylist() == expected  # score-positives and judge-negatives
    assert [passage(x, y) for x, y in zip(titles, abstracts)] == expected
    long = passage("A title", "x" * 2500)  # the abstract is cut at 2,000 characters, not the title
    assert long == "A title. " + "x" * 2000
    assert document_texts(t, a) == expected  # cpr eval and the search index
    pooled = doc_text(t, a, PoolerConfig.model_fields["doc_template"].default)
    assert pooled.to_pylist() == expected
    answered = pa.table(
        {
            "status": ["ok"] * 5,
            "title": t,
            "abstract": a,
            "kinds": [["factual"]] * 5,
            "queries": [[f"how to {i}"] for i in range(5)],
            "positive_id": pa.array(range(5), pa.int64()),
            "query_id": [f"q{i}" for i in range(5)],
        }
    )
    assert [r["positive"] for r in multi_query_rows(answered).to_pylist()] == expected

    storage = Storage(StorageConfig(root=str(tmp_path)))
    corpus = pa.table(
        {
            "corpus_id": pa.array(range(5), pa.int64()),
            "title": t,
            "abstract": a,
            "year": pa.array([2020] * 5, pa.int32()),
            "field": ["Physics"] * 5,
            "domain": ["Physical Sciences"] * 5,
            "topics": pa.nulls(5, pa.list_(TOPIC)),
        }
    )
    storage.write_parquet(corpus, join(str(tmp_path), "export", "corpus.parquet"))
    searched = load_documents(storage, join(str(tmp_path), "export")).table
    assert searched["text"].to_pylist() == expected
    triplets = tmp_path / "cpr"
    storage.write_parquet(corpus, join(str(triplets), "corpus.parquet"))
    train = pa.table(
        {
            "query_id": [f"q{i}" for i in range(5)],
            "query": [f"how to {i}" for i in range(5)],
            "base_corpus_id": pa.array([99] * 5, pa.int64()),
            "positive_id": pa.array(range(5), pa.int64()),
            "negative_ids": pa.array([[]] * 5, pa.list_(pa.int64())),
            "field": ["Physics"] * 5,
            "domain": ["Physical Sciences"] * 5,
        }
    )
    storage.write_parquet(train, join(str(triplets), "cpr-train.parquet"))
    examples, _ = read_examples(storage, DataOptions(format="cpr", data=str(triplets)))
    assert sorted(examples["positive"].to_pylist()) == sorted(expected)
