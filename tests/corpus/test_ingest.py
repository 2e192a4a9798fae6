"""The ingest stage end to end on Ray: the bundled sample locally and through S3 on loopback."""

from __future__ import annotations

import gzip

import lance
import pyarrow.parquet as pq
import pytest

from cpr_ray.config import load_config
from cpr_ray.corpus.ingest import ingest
from cpr_ray.errors import InputError
from cpr_ray.storage.store import Storage

pytestmark = pytest.mark.usefixtures("ray_session")

# what the bundled sample must give (see cpr_ray/sample/PROVENANCE.md for where each comes from)
EXPECTED_JOIN = {"doi": 3203, "mag": 350, "pmid": 20, "none": 111}


def _cfg(root: str, **extra: str):
    overrides = [f"storage.root={root}", *(f"{k}={v}" for k, v in extra.items())]
    return load_config("dry-run", overrides=overrides, env={})


def _check_sample_build(manifest: dict, storage: Storage) -> None:
    stats = manifest["stats"]
    assert stats["join_by_key"] == EXPECTED_JOIN
    assert stats["papers"] == 3684 and stats["papers_with_abstract"] == 2345
    shards = {"shards": 2, "empty_shards": 0, "quarantined_shards": 0}
    assert stats["inputs"]["papers"] == {
        "kept": 3684,
        "rejected": 4,
        "skipped": 0,
        "duplicates": 0,
        **shards,
    }
    assert stats["inputs"]["citations"] == {
        "kept": 7835,
        "rejected": 2,
        "skipped": 20,
        "duplicates": 0,
        **shards,
    }
    assert stats["quarantined_shards"] == []
    assert stats["citations_with_context"] > 150  # recovered from the real S2ORC spans
    assert stats["openalex_snapshot"] == "openalex updated_date<=2026-03-01"
    opts = storage.lance_options()
    papers = lance.dataset(manifest["tables"]["papers"]["uri"], storage_options=opts)
    assert papers.has_stable_row_ids
    assert papers.schema.field("corpus_id").type.bit_width == 64
    row = papers.to_table(filter="corpus_id = 110308591").to_pylist()[0]
    assert row["field"] == "Engineering" and len(row["topics"]) == 3
    citations = lance.dataset(manifest["tables"]["citations"]["uri"], storage_options=opts)
    assert citations.has_stable_row_ids
    recovered = citations.to_table(filter="context_source = 's2orc'")
    assert recovered.num_rows == stats["citations_with_context"]
    assert all(len(c) > 0 for c in recovered["contexts"].to_pylist())


def test_sample_ingest_local_then_skip_then_rerun(tmp_path):
    cfg = _cfg(str(tmp_path / "build"))
    storage = Storage(cfg.storage)
    first = ingest(cfg, storage)
    _check_sample_build(first, storage)

    rejects = pq.read_table(first["tables"]["rejects"]["uri"]).to_pylist()
    assert sorted((r["dataset"], r["reason"]) for r in rejects) == [
        ("citations", "malformed_json"),
        ("citations", "missing_citingcorpusid"),
        ("papers", "bad_corpusid"),
        ("papers", "malformed_json"),
        ("papers", "malformed_json"),
        ("papers", "missing_corpusid"),
    ]
    assert all(r["raw"] and r["path"].endswith("malformed.jsonl.gz") for r in rejects)

    venues = pq.read_table(first["tables"]["venues"]["uri"])
    assert venues.num_rows == 780
    assert venues.filter(venues["openalex_source_id"].is_valid()).num_rows == 635
    papers = lance.dataset(first["tables"]["papers"]["uri"])
    assert sum(venues["n_papers"].to_pylist()) == papers.count_rows(filter="venue_id IS NOT NULL")
    top = max(venues.to_pylist(), key=lambda v: v["n_papers"])
    assert top["field"] is not None and 0 < top["field_share"] <= 1

    again = ingest(cfg, storage)
    assert again["run_id"] == first["run_id"]  # skipped: same inputs, same config

    changed = _cfg(str(tmp_path / "build"), **{"ingest.num_buckets": "3"})
    rerun = ingest(changed, storage)
    assert rerun["run_id"] != first["run_id"]  # a knob of this stage changed
    _check_sample_build(rerun, storage)  # same answer with another bucketing
    # (--force reruns a stage whatever changed: tests/storage/test_storage.py)
    runs = sorted(p.name for p in (tmp_path / "build" / "ingest" / "runs").iterdir())
    assert runs == [rerun["run_id"]]  # superseded runs are removed after publishing


def test_missing_required_input_is_named(tmp_path):
    empty = tmp_path / "raw"
    (empty / "s2" / "papers").mkdir(parents=True)
    cfg = _cfg(
        str(tmp_path / "b"), **{"input.s2": str(empty / "s2"), "input.openalex": str(empty / "oa")}
    )
    with pytest.raises(InputError, match=r"no shards .* for required input 'papers'"):
        ingest(cfg, Storage(cfg.storage))
    (empty / "s2" / "papers" / "p.jsonl.gz").write_bytes(gzip.compress(b'{"corpusid": 1}\n'))
    with pytest.raises(
        InputError, match=r"required input 'citations' not found at .*/s2/citations"
    ):
        ingest(cfg, Storage(cfg.storage))


def test_wrong_dataset_fails_on_reject_rate(tmp_path):
    raw = tmp_path / "raw"
    for sub in ("s2/papers", "s2/citations", "oa/works"):
        (raw / sub).mkdir(parents=True)
    (raw / "s2/papers/p.jsonl").write_text("<html>not a shard</html>\n" * 10 + '{"corpusid": 1}\n')
    (raw / "s2/citations/c.jsonl").write_text('{"citingcorpusid": 1, "citedcorpusid": 2}\n')
    (raw / "oa/works/w.jsonl").write_text('{"id": "https://openalex.org/W1"}\n')
    cfg = _cfg(
        str(tmp_path / "b"),
        **{
            "input.s2": str(raw / "s2"),
            "input.openalex": str(raw / "oa"),
            "ingest.max_reject_rate": "0.2",
        },
    )
    with pytest.raises(InputError, match=r"10 of 11 lines of 'papers' were rejected .*/rejects"):
        ingest(cfg, Storage(cfg.storage))
