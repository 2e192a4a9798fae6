"""S3 as it behaves at cluster scale: `503 SlowDown`, `500 InternalError` and connections reset
mid-answer, from the fault proxy (tests/s3_faults.py) in front of the S3 stand-in. Every read
and write through `Storage` gets the bytes a fault-free store gives; a conditional write whose
answer was lost after it landed is still the caller's. The build, training and index through the
proxy are in tests/test_iam_policy.py (one build, not a second one).
"""

from __future__ import annotations

import pyarrow as pa

from cpr_ray.storage import Storage, StorageConfig

from .conftest import S3Faults


def _storage(faults: S3Faults) -> Storage:
    return Storage(StorageConfig(s3_endpoint=faults.url))


def test_reads_and_writes_give_what_a_fault_free_store_gives(faults: S3Faults, s3_bucket: str):
    storage = _storage(faults)
    table = pa.table({"id": list(range(2000)), "text": [f"row {i}" for i in range(2000)]})
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
    assert not storage.exists(uri)
    faults.clear()
    assert storage.write_if(uri, b"owner B") is not None
    assert storage.write_if(uri, b"owner C") is None  # taken: a real loss still reads as one
