"""S3 as it behaves at cluster scale: `503 SlowDown`, `500 InternalError` and connections reset
mid-answer, from the fault proxy (tests/standins/s3_faults.py) in front of the S3 stand-in. Every
read and write through `Storage` gets the bytes a fault-free store gives; a conditional write whose
answer was lost after it landed is still the caller's. The build, training and index through the
proxy are in tests/storage/test_iam_policy.py (one build, not a second one).
"""

from __future__ import annotations

import lance
import pyarrow as pa

from cpr_ray.storage.s3_retries import lance_retries, storage_retries
from cpr_ray.storage.store import Storage, StorageConfig
from tests.standins.clients import S3Faults


def _storage(faults: S3Faults) -> Storage:
    return Storage(StorageConfig(s3_endpoint=faults.url))


def test_reads_and_writes_give_what_a_fault_free_store_gives(faults: S3Faults, s3_bucket: str):
    storage = _storage(faults)
    table = pa.table({"id": list(range(500)), "text": [f"row {i}" for i in range(500)]})
    base = f"s3://{s3_bucket}/builds/b"
    faults.start(seed=3, max_faults=6, slowdown=0.15, internal=0.15, reset=0.15)
    for i in range(3):
        storage.write_parquet(table, f"{base}/t{i}.parquet")
        storage.write_json(f"{base}/m{i}.json", {"i": i})
    read = [storage.read_parquet(f"{base}/t{i}.parquet") for i in range(3)]
    docs = [storage.read_json(f"{base}/m{i}.json") for i in range(3)]
    stats = faults.stats()
    assert all(stats["faults"][kind] > 0 for kind in ("slowdown", "internal", "reset")), stats
    assert all(t.equals(table) for t in read)
    assert docs == [{"i": i} for i in range(3)]
    names = sorted(i.path.rsplit("/", 1)[1] for i in storage.list_files(base))
    assert names == sorted([f"t{i}.parquet" for i in range(3)] + [f"m{i}.json" for i in range(3)])


def test_a_conditional_write_whose_answer_was_lost_is_still_the_callers(
    faults: S3Faults, s3_bucket: str
):
    """The first request of each step lands at the store, then its connection is reset: boto3
    sends it again and S3 refuses the condition (the object is already there, or gone), which
    without a look at what landed would read as another writer having won the lease."""
    storage = _storage(faults)
    uri = f"s3://{s3_bucket}/builds/b/_lease.json"
    retries = storage_retries()

    def reset_next() -> None:
        faults.start(max_faults=1, reset=1.0)

    reset_next()
    tag = storage.write_if(uri, b"owner A, 1")  # If-None-Match: *
    assert tag is not None and faults.stats()["faults"]["reset"] == 1
    reset_next()
    tag = storage.write_if(uri, b"owner A, 2", tag=tag)  # If-Match
    assert tag is not None
    reset_next()
    assert storage.read_tagged(uri) == (b"owner A, 2", tag)  # the body broken off mid-way
    assert storage.write_if(uri, b"owner B", tag="0" * 32) is None  # someone else's tag: refused
    reset_next()
    assert storage.delete_if(uri, tag)
    # each reset counted once: three requests boto3 sent again, one read `Storage` read again
    assert storage_retries() - retries == 4
    assert not storage.exists(uri)
    faults.clear()
    assert storage.write_if(uri, b"owner B") is not None
    assert storage.write_if(uri, b"owner C") is None  # taken: a real loss still reads as one


LIST_VERSIONS = r"^GET [^?]*\?list-type=2.*_versions"  # a listing of a Lance table's versions


def _upsert(storage: Storage, uri: str, rows: pa.Table) -> None:
    (
        storage.open_lance(uri)
        .merge_insert("corpus_id")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute(rows)
    )


def test_lance_commits_at_a_high_fault_rate_land_once_each(faults: S3Faults, s3_bucket: str):
    """A refresh's upserts into a corpus table with 40% of requests failing: each commit lands,
    once (one version each, the rows a fault-free store holds). Lance's client passes up a
    listing of `_versions/` broken off mid-body, which every commit makes first (the first
    step's is reset); `Storage` makes the commit again. The manifest's PUT, the commit's last
    request, reset after it landed (the second step's) Lance resolves itself. What the stage
    summaries count is checked against the proxy: every 5xx Lance saw, and what `Storage`
    sent again (at most one per reset)."""
    storage = _storage(faults)
    uri = f"s3://{s3_bucket}/builds/b/papers.lance"
    ids = pa.array(range(100), pa.int64())
    lance.write_dataset(
        pa.table({"corpus_id": ids, "v": ["r"] * 100}),
        uri,
        storage_options=storage.lance_options(uri),
    )
    expected = dict.fromkeys(range(100), "r")
    counted, injected = 0, dict.fromkeys(("slowdown", "internal", "reset"), 0)
    for step in range(4):
        keys = range(step * 20, step * 20 + 30)
        rows = pa.table({"corpus_id": pa.array(keys, pa.int64()), "v": [f"u{step}"] * 30})
        expected.update(dict.fromkeys(keys, f"u{step}"))
        before, retries, in_lance = (
            storage.open_lance(uri).version,
            storage_retries(),
            lance_retries(),
        )
        if step == 0:  # past the listings of the version before and of the opening: the commit's
            faults.start(max_faults=1, reset=1.0, match=LIST_VERSIONS, skip=2)
        elif step == 1:  # the manifest's PUT, after it landed: Lance finds it is its own
            faults.start(max_faults=1, reset=1.0, match=r"^PUT .*_versions/")
        else:
            faults.start(seed=step, max_faults=12, slowdown=0.14, internal=0.13, reset=0.13)
        storage.commit_lance(uri, lambda rows=rows: _upsert(storage, uri, rows))
        stats = faults.stats()
        faults.clear()
        table = storage.open_lance(uri)
        assert table.version == before + 1, stats
        got = table.to_table()
        assert dict(zip(got["corpus_id"].to_pylist(), got["v"].to_pylist())) == expected
        served = stats["faults"]
        # every request here is Lance's: each 5xx it saw is counted, and each reset at most once
        assert lance_retries() - in_lance == served["slowdown"] + served["internal"], stats
        again = storage_retries() - retries - (lance_retries() - in_lance)
        assert again <= served["reset"] and (step or again == 1), stats
        counted += storage_retries() - retries
        injected = {k: injected[k] + served[k] for k in injected}
    print("faults", injected, "counted", counted)
    assert all(injected.values()), injected
