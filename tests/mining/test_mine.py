"""venues → mine on Ray: a synthetic corpus checked against one DuckDB query over the whole
tables (the bucketed pipeline must give the same pairs), and what mining the bundled sample
gives (checked on the test S3 by tests/storage/test_iam_policy.py's build)."""

from __future__ import annotations

import duckdb
import lance
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from cpr_ray.config import load_config
from cpr_ray.corpus.ingest import ingest
from cpr_ray.mining.mining_stages import mine, venues
from cpr_ray.sample.synthetic import generate
from cpr_ray.storage.store import Storage, StorageError
from cpr_ray.tables import buckets
from tests.builds import assert_equals_whole_table_mining

pytestmark = pytest.mark.usefixtures("ray_session")


def _build(cfg):
    storage = Storage(cfg.storage)
    ingest(cfg, storage)
    venues(cfg, storage)
    return storage, mine(cfg, storage)


def _read(storage, uri):
    loc = storage.resolve(uri)
    return pq.read_table(loc.path, filesystem=loc.fs)


def check_mined_sample(storage: Storage, manifest: dict) -> None:
    """What mining the bundled sample gives, wherever it ran (tests/storage/test_iam_policy.py mines
    it on the test S3, as a step of its build under the shipped IAM policy)."""
    stats = manifest["stats"]
    drawn = {f: e["drawn"] for f, e in stats["eligible_per_field"].items()}
    assert len(set(drawn.values())) == 1 and len(drawn) >= 5  # same count in every field
    pairs = _read(storage, manifest["tables"]["pairs"]["uri"])
    assert pairs.num_rows == stats["pairs"] > 0
    papers = lance.dataset(
        manifest_papers(storage), storage_options=storage.lance_options()
    ).to_table(columns=["corpus_id", "topics"])
    topics = {r["corpus_id"]: {t["id"] for t in r["topics"] or []} for r in papers.to_pylist()}
    for row in pairs.to_pylist():
        assert topics[row["base_id"]] and topics[row["cited_id"]]
        assert not topics[row["base_id"]] & topics[row["cited_id"]]
    assert manifest["tables"]["universe"]["rows"] > pairs.num_rows
    assert storage.read_json(f"{manifest['output']}/stats.json")["pairs"] == pairs.num_rows


def manifest_papers(storage):
    return storage.read_json(f"{storage.root}/ingest/_MANIFEST.json")["tables"]["papers"]["uri"]


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    raw = tmp_path_factory.mktemp("synth")
    generate(raw, 3000, 30000, seed=3)
    return raw


def test_mine_equals_one_duckdb_query_and_context_switch(synthetic, tmp_path, capfd):
    overrides = [
        f"storage.root={tmp_path}",
        f"input.s2={synthetic}/s2",
        f"input.openalex={synthetic}/openalex",
        "ingest.num_buckets=3",
        "mining.base_per_field=4",
        "ingest.max_reject_rate=0.01",
    ]
    cfg = load_config(
        "dry-run",
        overrides=[*overrides, "mining.base_requires_context=true", "mining.min_venue_papers=20"],
        env={},
    )
    storage, manifest = _build(cfg)
    base = _read(storage, manifest["tables"]["base_papers"]["uri"])
    assert set(manifest["stats"]["eligible_per_field"]) and all(
        e["drawn"] == min(4, e["eligible"])
        for e in manifest["stats"]["eligible_per_field"].values()
    )
    assert all(base["has_context"].to_pylist())

    ingest_m = storage.read_json(f"{tmp_path}/ingest/_MANIFEST.json")
    con = duckdb.connect()
    con.register("papers", lance.dataset(ingest_m["tables"]["papers"]["uri"]).to_table())
    con.register("citations", lance.dataset(ingest_m["tables"]["citations"]["uri"]).to_table())
    con.register("base", base)
    expected = con.sql("""
        SELECT c.citing_id, c.cited_id FROM citations c
        JOIN base b ON b.corpus_id = c.citing_id
        JOIN papers q ON q.corpus_id = c.citing_id
        JOIN papers d ON d.corpus_id = c.cited_id
        WHERE len(d.topics) > 0 AND len(q.topics) > 0
          AND len(list_intersect(list_transform(q.topics, lambda t: t.id),
                                 list_transform(d.topics, lambda t: t.id))) = 0
    """).fetchall()
    pairs = _read(storage, manifest["tables"]["pairs"]["uri"])
    got = set(zip(pairs["base_id"].to_pylist(), pairs["cited_id"].to_pylist()))
    assert got == set(expected) and len(got) > 10
    assert_equals_whole_table_mining(storage, cfg, manifest)
    with_context = {(r["base_id"], r["cited_id"]) for r in pairs.to_pylist() if r["has_context"]}
    assert 0 < len(with_context) < len(got)

    strict = load_config(
        "dry-run",
        overrides=[
            *overrides,
            "mining.base_requires_context=true",
            "mining.min_venue_papers=20",
            "mining.keep_pairs_without_context=false",
        ],
        env={},
    )
    capfd.readouterr()
    rerun = mine(strict, storage)  # a mining knob changed: mine reruns, ingest is reused
    assert rerun["run_id"] != manifest["run_id"]
    strict_pairs = _read(storage, rerun["tables"]["pairs"]["uri"])
    dropped = len(got) - len(with_context)
    assert rerun["stats"]["pairs_without_context_dropped"] == dropped
    printed = " ".join(capfd.readouterr().err.split())  # the console wraps at its width
    assert (
        f"{dropped:,} of {len(got):,} cross-topic pairs dropped for having no citing sentence"
        in printed
    )
    assert (
        set(zip(strict_pairs["base_id"].to_pylist(), strict_pairs["cited_id"].to_pylist()))
        == with_context
    )


def test_ingest_writes_every_bucket_as_fragments_of_its_own(synthetic, tmp_path):
    """The layout mining reads: each fragment holds one key bucket, and the record says which."""
    cfg = load_config(
        "dry-run",
        overrides=[
            f"storage.root={tmp_path}",
            f"input.s2={synthetic}/s2",
            f"input.openalex={synthetic}/openalex",
            "ingest.num_buckets=3",
            "ingest.lance_fragment_rows=1000",
            "ingest.max_reject_rate=0.01",
        ],
        env={},
    )
    storage = Storage(cfg.storage)
    tables = ingest(cfg, storage)["tables"]
    for name, key in (("papers", "corpus_id"), ("citations", "citing_id")):
        recorded = buckets.BucketLayout.from_dict(tables[name]["layout"])
        assert (recorded.key, recorded.num_buckets) == (key, 3)
        ds = lance.dataset(tables[name]["uri"])
        fragments = ds.get_fragments()
        assert len(fragments) >= 3 + (name == "citations") * 3  # 10,000 citations per bucket
        for fragment in fragments:
            bucket = recorded.files[fragment.metadata.data_files()[0].path]
            keys = fragment.to_table(columns=[key])[key]
            assert set(pc.remainder(keys, 3).to_pylist()) == {bucket}
        p = buckets.plan(recorded, storage, tables[name]["uri"], tables[name]["version"])
        assert p.mixed == [] and p.rows == ds.count_rows()
        for k in range(3):
            rows = buckets.read_lance_bucket(p, storage, k, [key])[key]
            assert len(rows) == pc.sum(pc.equal(pc.remainder(ds.to_table()[key], 3), k)).as_py()


def test_mine_before_ingest_says_what_to_run(tmp_path):
    cfg = load_config("dry-run", overrides=[f"storage.root={tmp_path}"], env={})
    with pytest.raises(
        StorageError, match=r"stage 'ingest' has no published output .*cpr build --stages ingest"
    ):
        mine(cfg, Storage(cfg.storage))
