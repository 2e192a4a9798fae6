"""One code path for local and S3 storage; failures name what to fix."""

import pytest

from cpr_ray.config import load_config
from cpr_ray.runs.stage_runner import StageOutput, read_manifest, run_stage
from cpr_ray.storage.store import Storage, StorageConfig, StorageError, join


def _roundtrip(storage: Storage, root: str) -> None:
    uri = join(root, "a", "b.json")
    assert not storage.exists(uri)
    storage.write_json(uri, {"x": [1, 2]})
    assert storage.exists(uri)
    assert storage.read_json(uri) == {"x": [1, 2]}
    assert [f.base_name for f in storage.list_files(root)] == ["b.json"]
    assert storage.list_dirs(root) == [join(root, "a")]
    storage.delete_dir(join(root, "a"))
    assert not storage.exists(uri)


def test_local_paths_and_file_uris(tmp_path):
    storage = Storage(StorageConfig(root=str(tmp_path)))
    _roundtrip(storage, str(tmp_path / "x"))
    _roundtrip(storage, f"file://{tmp_path}/y")


def test_s3_endpoint_same_code_path(s3_endpoint, s3_bucket):
    storage = Storage(StorageConfig(root=f"s3://{s3_bucket}", s3_endpoint=s3_endpoint))
    _roundtrip(storage, f"s3://{s3_bucket}/prefix")
    assert storage.lance_options()["aws_endpoint"] == s3_endpoint
    assert storage.lance_options()["allow_http"] == "true"


def test_unreachable_endpoint_gives_one_clear_message():
    storage = Storage(StorageConfig(root="s3://b", s3_endpoint="http://127.0.0.1:9"))
    with pytest.raises(StorageError, match=r"cannot reach s3://b/x.*storage.s3_endpoint"):
        storage.check("s3://b/x")


def test_missing_bucket_is_named(s3_endpoint):
    storage = Storage(StorageConfig(root="s3://nope", s3_endpoint=s3_endpoint))
    with pytest.raises(StorageError, match=r"s3://no-such-bucket-here/x.json.*bucket"):
        storage.write_json("s3://no-such-bucket-here/x.json", {})
    with pytest.raises(StorageError, match=r"s3://no-such-bucket-here/y does not exist"):
        storage.check("s3://no-such-bucket-here/y", must_exist=True)


def test_bad_inputs_are_named():
    with pytest.raises(StorageError, match="unsupported storage scheme 'gs'"):
        Storage(StorageConfig(root="/tmp")).resolve("gs://b/x")
    with pytest.raises(StorageError, match="must look like http://host:port"):
        Storage(StorageConfig(root="s3://b", s3_endpoint="localhost")).resolve("s3://b/x")


def test_stage_publishes_manifest_last_and_skips_on_match(tmp_path):
    cfg = load_config("dry-run", overrides=[f"storage.root={tmp_path}"], env={})
    storage = Storage(cfg.storage)
    calls = []

    def fn(run):
        calls.append(run.run_id)
        storage.write_json(join(run.out, "t.json"), {"n": 1})
        return StageOutput(
            tables={"t": {"uri": join(run.out, "t.json"), "rows": 1, "format": "json"}}
        )

    m1 = run_stage("demo", cfg, storage, {"in": "a"}, ("ingest",), fn)
    m2 = run_stage("demo", cfg, storage, {"in": "a"}, ("ingest",), fn)
    assert m1["run_id"] == m2["run_id"] and len(calls) == 1
    m3 = run_stage("demo", cfg, storage, {"in": "b"}, ("ingest",), fn)  # new input → rerun
    assert len(calls) == 2 and read_manifest(storage, "demo")["run_id"] == m3["run_id"]
    forced = run_stage("demo", cfg, storage, {"in": "b"}, ("ingest",), fn, force=True)
    assert len(calls) == 3 and forced["run_id"] != m3["run_id"]  # --force: rerun all the same

    def crash(run):
        storage.write_json(join(run.out, "partial.json"), {})
        raise RuntimeError("worker died")

    with pytest.raises(RuntimeError):
        run_stage("demo", cfg, storage, {"in": "c"}, ("ingest",), crash)
    # the published output is still the last good one; the crash left only an orphan run
    assert read_manifest(storage, "demo")["run_id"] == forced["run_id"]
    assert storage.exists(forced["tables"]["t"]["uri"])
