"""The shipped IAM policy (infra/iam-policy.json), enforced on the tests' S3 stand-in: a build, a
training run, an evaluation and an index on the documented prefixes need nothing it does not
grant, a path outside them stops in one line naming the prefix, and the public OpenAlex bucket
is read unsigned from its own region beside the team's bucket.

The evaluator (tests/standins/iam_policy.py) is ours: see its docstring for why no library or moto's
own enforcement fits; its rules are tested first, here.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import time
from collections import Counter
from pathlib import Path

import boto3
import pytest
from typer.testing import CliRunner

from cpr_ray.config import load_config, sample_dir
from cpr_ray.cpr_command import app
from cpr_ray.errors import StorageError
from cpr_ray.pipeline.build import STAGES, check_root, run_build
from cpr_ray.storage.store import Storage, StorageConfig
from tests.builds import LLM_STAGES, OLD, copy_build, small_build
from tests.corpus.test_ingest import _check_sample_build
from tests.mining.test_mine import check_mined_sample
from tests.standins.clients import S3Faults, S3Standin, ScriptedLLM
from tests.standins.iam_policy import (
    ALLOW,
    EXPLICIT_DENY,
    IMPLICIT_DENY,
    Need,
    S3Request,
    evaluate,
    needs,
    not_found_need,
    render,
)

POLICY = Path(__file__).resolve().parents[2] / "infra" / "iam-policy.json"
OPENALEX = "openalex"  # the public snapshot's bucket, on the stand-in
cli = CliRunner()


def policy_for(bucket: str) -> dict:
    return json.loads(render(POLICY.read_text(), bucket))


# -- the evaluator -----------------------------------------------------------------------------

LIST = "arn:aws:s3:::b"
PREFIXED = {
    "Statement": [
        {
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": LIST,
            "Condition": {"StringLike": {"s3:prefix": ["builds/*", "s2/*"]}},
        },
        {"Effect": "Allow", "Action": ["s3:Get*", "s3:PutObject"], "Resource": f"{LIST}/builds/*"},
        {"Effect": "Deny", "Action": "s3:*", "Resource": f"{LIST}/builds/secret/*"},
    ]
}


@pytest.mark.parametrize(
    "need, decision",
    [
        (Need("s3:ListBucket", LIST, {"s3:prefix": "builds/x/"}), ALLOW),
        (Need("s3:ListBucket", LIST, {"s3:prefix": "builds"}), IMPLICIT_DENY),  # no slash
        (Need("s3:ListBucket", LIST, {"s3:prefix": ""}), IMPLICIT_DENY),  # the top level
        (Need("s3:ListBucket", LIST), IMPLICIT_DENY),  # HeadBucket: no prefix in the request
        (Need("S3:getobject", f"{LIST}/builds/a"), ALLOW),  # actions ignore case
        (Need("s3:GetObject", f"{LIST}/Builds/a"), IMPLICIT_DENY),  # resources do not
        (Need("s3:PutObject", f"{LIST}/runs/a"), IMPLICIT_DENY),
        (Need("s3:DeleteObject", f"{LIST}/builds/a"), IMPLICIT_DENY),
        (Need("s3:GetObject", f"{LIST}/builds/secret/k"), EXPLICIT_DENY),  # Deny wins
    ],
)
def test_the_evaluator_decides_as_iam_does(need, decision):
    assert evaluate(PREFIXED, need) == decision


def test_condition_operators_on_absent_keys_and_unknown_ones():
    def st(op: str) -> dict:
        return {
            "Statement": {
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": LIST,
                "Condition": {op: {"s3:prefix": "a?/*"}},
            }
        }

    absent, hit, miss = (
        Need("s3:ListBucket", LIST),
        Need("s3:ListBucket", LIST, {"s3:prefix": "ab/c"}),
        Need("s3:ListBucket", LIST, {"s3:prefix": "abc/c"}),
    )
    assert [evaluate(st("StringLike"), n) for n in (absent, hit, miss)] == [
        IMPLICIT_DENY, ALLOW, IMPLICIT_DENY
    ]  # fmt: skip
    assert evaluate(st("StringLikeIfExists"), absent) == ALLOW
    assert [evaluate(st("StringNotLike"), n) for n in (absent, hit, miss)] == [
        ALLOW, IMPLICIT_DENY, ALLOW
    ]  # fmt: skip
    with pytest.raises(NotImplementedError, match="NumericLessThan"):
        evaluate(st("NumericLessThan"), hit)


def test_s3_requests_map_to_the_permissions_aws_documents():
    def one(method: str, path: str, query: str = "", **kw) -> list[str]:
        return [str(n) for n in needs(S3Request(method, path, query, **kw))]

    assert one("HEAD", "/b") == ["s3:ListBucket arn:aws:s3:::b"]
    assert one("GET", "/b", "list-type=2&prefix=builds%2Fx%2F&max-keys=1") == [
        "s3:ListBucket arn:aws:s3:::b s3:prefix='builds/x/'"
    ]
    assert one("PUT", "/b/builds/y", copy_source="/b/builds/x%3D1") == [
        "s3:PutObject arn:aws:s3:::b/builds/y",
        "s3:GetObject arn:aws:s3:::b/builds/x=1",
    ]
    assert one("POST", "/b", "delete", delete_keys=("k1", "k2")) == [
        "s3:DeleteObject arn:aws:s3:::b/k1",
        "s3:DeleteObject arn:aws:s3:::b/k2",
    ]
    assert one("DELETE", "/b/k", "uploadId=u") == ["s3:AbortMultipartUpload arn:aws:s3:::b/k"]
    assert str(not_found_need(S3Request("HEAD", "/b/builds/m.json"))) == (
        "s3:ListBucket arn:aws:s3:::b s3:prefix='builds/m.json'"
    )
    with pytest.raises(ValueError, match="unmapped"):
        needs(S3Request("GET", "/b/k", "tagging"))


def test_versions_newlines_whole_values_and_condition_key_case_as_iam_has_them():
    """The four places the evaluator once differed from IAM: reading or deleting a given version
    is its own action; `*` matches a newline in a key; a pattern covers the whole value (a
    regex `$` would also match before a trailing newline); condition key names ignore case."""

    def one(method: str, path: str, query: str = "") -> list[str]:
        return [str(n) for n in needs(S3Request(method, path, query))]

    assert one("GET", "/b/k", "versionId=v1") == ["s3:GetObjectVersion arn:aws:s3:::b/k"]
    assert one("HEAD", "/b/k", "versionId=v1") == ["s3:GetObjectVersion arn:aws:s3:::b/k"]
    assert one("DELETE", "/b/k", "versionId=v1") == ["s3:DeleteObjectVersion arn:aws:s3:::b/k"]
    assert evaluate(PREFIXED, Need("s3:GetObjectVersion", f"{LIST}/builds/a")) == ALLOW  # Get*
    only_get = {"Statement": {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"}}
    assert evaluate(only_get, Need("s3:GetObjectVersion", f"{LIST}/builds/a")) == IMPLICIT_DENY
    assert evaluate(PREFIXED, Need("s3:GetObject", f"{LIST}/builds/a\nb")) == ALLOW
    exact = {"Statement": {"Effect": "Allow", "Action": "s3:GetObject", "Resource": f"{LIST}/k"}}
    assert evaluate(exact, Need("s3:GetObject", f"{LIST}/k")) == ALLOW
    assert evaluate(exact, Need("s3:GetObject", f"{LIST}/k\n")) == IMPLICIT_DENY
    cased = {
        "Statement": {
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": LIST,
            "Condition": {"StringLike": {"S3:Prefix": "builds/*"}},
        }
    }
    assert evaluate(cased, Need("s3:ListBucket", LIST, {"s3:prefix": "builds/x"})) == ALLOW
    assert evaluate(cased, Need("s3:ListBucket", LIST, {"s3:prefix": "Builds/x"})) == IMPLICIT_DENY


# -- the shipped policy on the stand-in --------------------------------------------------------


def _operator(endpoint: str):
    """The person who set up the account: seeds the inputs with a key the policy is not on."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="operator",
        aws_secret_access_key="operator-secret",
        region_name="us-east-1",
    )


def _seed(endpoint: str, bucket: str, s2_prefix: str) -> None:
    """The sample's S2 shards under `s2/`, and its OpenAlex snapshot in the snapshot's own layout
    (data/jsonl/ENTITY/updated_date=…/part_….gz and a manifest.json per entity) on the public
    bucket."""
    s3 = _operator(endpoint)
    for path in sorted((sample_dir() / "s2").rglob("*")):
        if path.is_file():
            key = f"{s2_prefix}/{path.relative_to(sample_dir() / 's2').as_posix()}"
            s3.upload_file(str(path), bucket, key)
    _public_bucket(s3)
    for entity in ("works", "sources"):
        parts = sorted((sample_dir() / "openalex" / entity).rglob("*.gz"))
        for part in parts:
            rel = part.relative_to(sample_dir() / "openalex").as_posix()
            s3.upload_file(
                str(part), OPENALEX, f"data/jsonl/{rel}", ExtraArgs={"ACL": "public-read"}
            )
        manifest = {
            "entries": [{"url": f"s3://openalex/data/jsonl/{p.name}"} for p in parts],
            "meta": {"record_count": sum(1 for p in parts for _ in gzip.open(p))},
        }
        s3.put_object(
            Bucket=OPENALEX,
            Key=f"data/jsonl/{entity}/manifest.json",
            Body=json.dumps(manifest).encode(),
            ACL="public-read",
        )


def _public_bucket(s3) -> None:
    """The snapshot's bucket, readable and listable by anyone (moto answers unsigned requests
    by the ACLs)."""
    if OPENALEX not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
        s3.create_bucket(Bucket=OPENALEX, ACL="public-read")


def _prefix(resource: str, context: dict) -> str:
    """`bucket/first-folder/` of a need: what the policy's prefixes are about."""
    bucket, _, key = resource.removeprefix("arn:aws:s3:::").partition("/")
    key = context.get("s3:prefix", key)
    return f"{bucket}/{key.split('/', 1)[0]}/" if "/" in key else f"{bucket}/{key}"


def _summary(requests: list[dict], bucket: str) -> Counter:
    return Counter(
        (n["action"], _prefix(n["resource"], n["context"]).replace(bucket, "BUCKET"))
        for r in requests
        for n in r["needs"]
    )


@pytest.mark.slow
def test_build_train_eval_and_index_need_only_what_the_shipped_policy_grants(
    s3_standin: S3Standin,
    faults: S3Faults,
    s3_bucket: str,
    scripted_llm: ScriptedLLM,
    ray_session: None,
    sample_mined: Path,
    minilm: str,
    tmp_path: Path,
):
    """…and through S3 as it is at cluster scale: every job request goes through the fault
    proxy (tests/standins/s3_faults.py), which answers a share `503 SlowDown` or `500 InternalError`
    and resets connections after the store acted; the outputs are those of a fault-free run: the
    shared local build of the sample (`sample_mined`), taken on to its export, and the same training
    and index on that export."""
    from tests import tiny_models

    endpoint, bucket = faults.url, s3_bucket
    _seed(s3_standin.url, bucket, f"s2/{OLD}")
    root = f"s3://{bucket}/builds/2026-11"
    settings = {
        "storage": {
            "root": root,
            "s3_endpoint": endpoint,
            "s3_region": "us-west-2",  # the team's bucket; the snapshot is in us-east-1
            "buckets": {OPENALEX: {"s3_region": "us-east-1", "s3_anonymous": True}},
        },
        "input": {"s2": f"s3://{bucket}/s2/{OLD}", "openalex": "s3://openalex/data/jsonl"},
    }
    _operator(endpoint).put_object(
        Bucket=bucket, Key="configs/build.yaml", Body=json.dumps(settings).encode()
    )
    scripted_llm.reset()
    scripted_llm.negatives(1)
    overrides = [
        f"storage.s3_endpoint={endpoint}",  # how to reach the config itself
        "storage.s3_region=us-west-2",
        *small_build(scripted_llm.base_url),
    ]
    model = tiny_models.tiny_bert(minilm, tmp_path / "tiny-bert")
    job_key = os.environ["AWS_ACCESS_KEY_ID"]  # what the tests' Ray workers sign with
    since = s3_standin.mark()
    faults.start(seed=11, max_faults=FAULTS, slowdown=0.01, internal=0.01, reset=0.01)
    with s3_standin.enforce(job_key, policy_for(bucket), public_buckets=(OPENALEX,)):
        cfg = load_config("dry-run", f"s3://{bucket}/configs/build.yaml", overrides, env={})
        manifests = run_build(cfg)
        export = manifests["export"]["output"]
        calls = scripted_llm.stats()["total"]
        again = run_build(cfg, LLM_STAGES, force=True)  # the answers cached on S3 are reused
        s3 = ["--s3-endpoint", endpoint, "--set", "storage.s3_region=us-west-2"]
        for args in _train_eval_index(export, model, f"s3://{bucket}"):
            result = cli.invoke(app, [*args, *s3])
            assert result.exit_code == 0, (args[0], result.output)
    requests = s3_standin.requests(since)
    injected = faults.stats()
    faults.clear()
    print("faults", injected["faults"], "of", injected["requests"], "requests;", "retries",
          {stage: m["storage_retries"] for stage, m in manifests.items()})  # fmt: skip
    assert all(injected["faults"][kind] for kind in ("slowdown", "internal", "reset")), injected
    # what the driver counted (its boto3, Lance and Storage retries; not the workers', nor
    # pyarrow's): never more than the proxy served (tests/storage/test_s3_faults.py checks it
    # exactly)
    assert sum(m["storage_retries"] for m in manifests.values()) <= sum(injected["faults"].values())
    _nothing_half_written(_operator(s3_standin.url), bucket, {**manifests, **again})
    # the sample's corpus, as a local ingest gives it; the snapshot's manifest.json unread
    ingested = manifests["ingest"]
    assert ingested["tables"]["papers"]["uri"].startswith(f"{root}/ingest/runs/")
    storage = Storage(cfg.storage)
    _check_sample_build(ingested, storage)
    assert ingested["stats"]["inputs"]["works"]["shards"] == 1
    check_mined_sample(storage, manifests["mine"])
    for stage in LLM_STAGES:
        m = manifests[stage]
        assert m["output"].startswith(f"{root}/{stage}/"), m
        assert m["complete"] and m["stats"]["new_failed"] == 0, (stage, m["stats"])
    assert manifests["score-positives"]["tables"]["positives"]["rows"] > 0
    assert scripted_llm.stats()["total"] == calls and again["judge-analogy"]["stats"]["asked"] == 0
    job = [r for r in requests if r["access_key"] != "operator"]
    refused = [r for r in job if r["decision"] != ALLOW]
    assert not refused, json.dumps(refused[:5], indent=1)
    # the team's bucket signed for its region; the snapshot unsigned, reads only
    assert {r["region"] for r in job if r["path"].split("/")[1] == bucket} == {"us-west-2"}
    public = [r for r in job if r["path"].split("/")[1] == OPENALEX]
    assert public and {r["access_key"] for r in public} == {None}
    summary = _summary(job, bucket)
    print("\n".join(f"{a} {p}: {n}" for (a, p), n in sorted(summary.items())))
    # every job prefix was used the way the policy says, and nothing else was asked
    assert {p for _, p in summary} <= {
        "BUCKET/s2/", "BUCKET/configs/", "BUCKET/builds/", "BUCKET/models/", "BUCKET/eval/",
        "BUCKET/index/", "openalex/data/",
    }  # fmt: skip
    # the fault-free run: the same stages on the shared local build, the same commands after
    clean_root = copy_build(sample_mined, tmp_path / "clean")
    clean_cfg = load_config(
        "dry-run", env={}, overrides=[f"storage.root={clean_root}", *overrides[2:]]
    )
    started = time.monotonic()
    through_export = [*STAGES][: [*STAGES].index("export") + 1]
    clean = run_build(clean_cfg, through_export)  # ingest, venues, mine: the shared ones, skipped
    for args in _train_eval_index(clean["export"]["output"], model, str(tmp_path / "clean-out")):
        if args[0] != "eval":  # metrics, not data: the same export gives the same
            result = cli.invoke(app, args)
            assert result.exit_code == 0, (args[0], result.output)
    clean_storage = Storage(clean_cfg.storage)
    compared = {
        what: _same_data(storage, faulty, clean_storage, reference)
        for what, faulty, reference in (
            ("export", export, clean["export"]["output"]),
            ("model", f"s3://{bucket}/models/tiny", str(tmp_path / "clean-out/models/tiny")),
            ("index", f"s3://{bucket}/index/tiny", str(tmp_path / "clean-out/index/tiny")),
        )
    }
    print("equal to the fault-free run:", compared, f"({time.monotonic() - started:.0f} s)")


def _train_eval_index(export: str, model: str, out: str) -> list[list[str]]:
    """The commands the test runs on the build's export, writing under `out`."""
    return [
        ["train", "--data", export, "--format", "cpr", "--model", model,
         "--out", f"{out}/models/tiny", "--set", "train.workers=1",
         "--set", "train.epochs=1", "--set", "train.batch_size=1",
         "--set", "train.max_length=32", "--set", "train.max_steps=2",
         "--set", "train.checkpoint_every=1"],
        ["eval", "--benchmark", "cpr", "--data", export, "--retriever", "bm25",
         "--out", f"{out}/eval/bm25"],
        ["index", "--corpus", export, "--model", model, "--out", f"{out}/index/tiny",
         "--set", "encoder.max_length=32"],
    ]  # fmt: skip


CHECKPOINT = re.compile(r"checkpoint_[0-9-_.]+")
DATA = (".parquet", ".safetensors")  # manifests, cards and stats hold times, run ids and paths


def _same_data(faulty: Storage, uri: str, clean: Storage, clean_uri: str) -> dict[str, int]:
    """The data files under `uri` and `clean_uri`: the same names, tables equal row for row and
    weights tensor for tensor (bit for bit: one worker, the same seed and data on CPU). Returns
    the rows and tensors compared, by file."""
    from safetensors.numpy import load

    def files(storage: Storage, root: str) -> dict[str, str]:
        """By name under `root`; Ray Train's checkpoints, named for the time, by their order."""
        base = storage.resolve(root).path
        found = [f.path for f in storage.list_files(root, DATA)]
        named = sorted({m for f in found for m in CHECKPOINT.findall(f)})
        order = {c: f"checkpoint_{i}" for i, c in enumerate(named)}
        scheme = "s3://" if root.startswith("s3://") else ""
        return {
            CHECKPOINT.sub(lambda m: order[m.group()], f.removeprefix(base)): scheme + f
            for f in found
        }

    ours, theirs = files(faulty, uri), files(clean, clean_uri)
    assert ours.keys() == theirs.keys() and ours, (sorted(ours), sorted(theirs))
    sizes = {}
    for name in ours:
        if name.endswith(".parquet"):
            got, want = faulty.read_parquet(ours[name]), clean.read_parquet(theirs[name])
            assert got.equals(want), name
            sizes[name] = got.num_rows
        else:
            got, want = load(faulty.read_bytes(ours[name])), load(clean.read_bytes(theirs[name]))
            assert got.keys() == want.keys(), name
            assert all((got[k] == want[k]).all() for k in got), name
            sizes[name] = len(got)
    return sizes


FAULTS = 20  # at most, in the build, training, evaluation and index (each costs a backoff)


def _nothing_half_written(s3, bucket: str, manifests: dict) -> None:
    """No temporary name left behind, every published table there, and an upload left open
    only beside the whole object (a retried CreateMultipartUpload whose first answer was lost
    orphans the first upload: invisible to readers, aborted by the bucket's lifecycle rule,
    infra/README.md)."""
    keys = [
        o["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        for o in page.get("Contents", [])
    ]
    assert not [k for k in keys if "/_tmp-" in k], keys
    open_uploads = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert {u["Key"] for u in open_uploads} <= set(keys), open_uploads
    for m in manifests.values():
        for table in m["tables"].values():
            prefix = table["uri"].removeprefix(f"s3://{bucket}/")
            assert any(k == prefix or k.startswith(prefix + "/") for k in keys), table


def test_a_root_outside_the_policys_prefixes_stops_preflight_in_one_line(
    s3_standin: S3Standin, s3_bucket: str
):
    cfg = load_config(
        "dry-run",
        overrides=[
            f"storage.root=s3://{s3_bucket}/runs/r1",
            f"storage.s3_endpoint={s3_standin.url}",
        ],
        env={},
    )
    # a table someone else wrote outside the prefixes: listing it is allowed, reading it is not
    _operator(s3_standin.url).put_object(
        Bucket=s3_bucket, Key="runs/r1/papers.lance/_versions/1.manifest", Body=b"x"
    )
    with s3_standin.enforce(os.environ["AWS_ACCESS_KEY_ID"], policy_for(s3_bucket)):
        with pytest.raises(StorageError) as err:
            run_build(cfg, ["ingest"])
        inside = Storage(cfg.storage.model_copy(update={"root": f"s3://{s3_bucket}/builds/b1"}))
        check_root(inside)  # a first build under builds/: nothing there yet, and allowed
        with pytest.raises(StorageError) as top:
            inside.write_json(f"s3://{s3_bucket}/x.json", {})
        with pytest.raises(StorageError) as table:
            inside.open_lance(f"s3://{s3_bucket}/runs/r1/papers.lance")
        # the README's old example: a training run out of the policy's prefixes
        out = f"s3://{s3_bucket}/runs/r1"
        result = cli.invoke(
            app,
            ["train", "--data", "unused.jsonl", "--format", "triplets", "--model", "unused",
             "--out", out, "--s3-endpoint", s3_standin.url],
        )  # fmt: skip
    message = str(err.value)
    # the policy lets a job list the bucket (infra/README.md says why), so the root's listing
    # answers; preflight's write check is refused
    assert message == (
        f"storage.root s3://{s3_bucket}/runs/r1: access denied to s3://{s3_bucket}/runs/r1/"
        f".cpr-write-check: these credentials may not use prefix runs/r1/.cpr-write-check of "
        f"bucket {s3_bucket} (infra/iam-policy.json lets jobs read s2/ and configs/ and write "
        "builds/, models/, eval/ and index/: put the path under one of those, or grant it)"
    )
    assert str(top.value).startswith(f"access denied to s3://{s3_bucket}/x.json: ")
    assert str(table.value).startswith(f"access denied to s3://{s3_bucket}/runs/r1/papers.lance")
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert result.output.strip().splitlines() == [
        f"error: access denied to {out}/.cpr-write-check: these credentials may not use prefix "
        + result.output.split("may not use prefix ", 1)[1].strip()
    ]
    assert f"prefix runs/r1/.cpr-write-check of bucket {s3_bucket} (" in result.output


@pytest.mark.parametrize("not_found", ["prefix", "bucket"])
def test_a_missing_key_is_missing_whether_s3_answers_404_or_403(
    s3_standin: S3Standin, s3_bucket: str, not_found: str
):
    """Existence under a policy whose list grant is limited to a prefix, whichever way S3 reads
    it for a missing key (tests/standins/iam_policy.py's `not_found_need`): a 404, or a 403 that a
    listing with the key as prefix settles. A key outside the policy stays one line naming its
    prefix."""
    storage = Storage(StorageConfig(s3_endpoint=s3_standin.url))
    root = f"s3://{s3_bucket}/builds/b1"
    narrow = policy_for(s3_bucket)  # an operator's narrower list grant than the shipped one
    narrow["Statement"][0]["Condition"] = {"StringLike": {"s3:prefix": ["builds/*"]}}
    _operator(s3_standin.url).put_object(Bucket=s3_bucket, Key="builds/b1/a/m.json", Body=b"{}")
    _operator(s3_standin.url).put_object(Bucket=s3_bucket, Key="runs/r1.json", Body=b"{}")
    since = s3_standin.mark()
    with s3_standin.enforce(os.environ["AWS_ACCESS_KEY_ID"], narrow, (), not_found):
        assert not storage.exists(f"{root}/owner.json")
        assert storage.exists(f"{root}/a/m.json") and storage.is_dir(f"{root}/a")
        assert not storage.is_file(f"{root}/a")
        with pytest.raises(FileNotFoundError):
            storage.read_json(f"{root}/manifest.json")
        with pytest.raises(FileNotFoundError):
            storage.read_tagged(f"{root}/owner.json")
        tag = storage.write_if(f"{root}/owner.json", b"me")
        assert tag and storage.write_if(f"{root}/owner.json", b"you") is None
        assert storage.read_tagged(f"{root}/owner.json") == (b"me", tag)
        storage.delete_dir(f"{root}/nothing-here")
        with pytest.raises(StorageError) as outside:
            storage.exists(f"s3://{s3_bucket}/runs/r1.json")
    answered = [
        r["status"]
        for r in s3_standin.requests(since)
        if r["method"] in ("GET", "HEAD") and r["path"].startswith(f"/{s3_bucket}/builds/")
    ]
    assert (403 in answered) == (not_found == "bucket"), answered  # the reading was exercised
    assert str(outside.value).startswith(
        f"access denied to s3://{s3_bucket}/runs/r1.json: these credentials may not use prefix "
        f"runs/r1.json of bucket {s3_bucket}"
    )


def test_a_delete_of_many_keys_deletes_those_allowed_and_names_a_refused_one(
    s3_standin: S3Standin, s3_bucket: str
):
    """DeleteObjects as S3 answers it: each key judged on its own, the allowed ones deleted,
    each refused one reported in the answer; Storage names the first refused in one line."""
    s3 = _operator(s3_standin.url)
    for key in ("builds/b1/x", "builds/b1/y", "s2/shard"):
        s3.put_object(Bucket=s3_bucket, Key=key, Body=b"1")
    job = boto3.client("s3", endpoint_url=s3_standin.url)
    storage = Storage(StorageConfig(s3_endpoint=s3_standin.url))
    with s3_standin.enforce(os.environ["AWS_ACCESS_KEY_ID"], policy_for(s3_bucket)):
        done = job.delete_objects(
            Bucket=s3_bucket,
            Delete={"Objects": [{"Key": k} for k in ("builds/b1/x", "s2/shard")], "Quiet": True},
        )
        with pytest.raises(StorageError) as err:
            storage.delete_files([f"s3://{s3_bucket}/s2/shard", f"s3://{s3_bucket}/builds/b1/y"])
    assert [(e["Key"], e["Code"]) for e in done["Errors"]] == [("s2/shard", "AccessDenied")]
    left = [o["Key"] for o in s3.list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert left == ["s2/shard"]
    assert str(err.value).startswith(
        f"access denied to s3://{s3_bucket}/s2/shard: these credentials may not use prefix "
        f"s2/shard of bucket {s3_bucket}"
    )


def test_two_buckets_with_their_own_region_and_signing_in_one_storage(
    s3_standin: S3Standin, s3_bucket: str
):
    """A public bucket read unsigned while the team's is signed for its region, through one
    Storage (and Lance's options per bucket); unsigned is refused on the team's bucket."""
    s3 = _operator(s3_standin.url)
    _public_bucket(s3)
    s3.put_object(Bucket=OPENALEX, Key="data/jsonl/probe.json", Body=b'{"a": 1}', ACL="public-read")
    cfg = StorageConfig(
        s3_endpoint=s3_standin.url,
        s3_region="eu-west-1",
        buckets={OPENALEX: {"s3_region": "us-east-1", "s3_anonymous": True}},
    )
    storage = Storage(cfg)
    since = s3_standin.mark()
    with s3_standin.enforce(
        os.environ["AWS_ACCESS_KEY_ID"], policy_for(s3_bucket), public_buckets=(OPENALEX,)
    ):
        storage.write_json(f"s3://{s3_bucket}/builds/x/probe.json", {"b": 2})
        assert storage.read_json(f"s3://{OPENALEX}/data/jsonl/probe.json") == {"a": 1}
        assert storage.read_json(f"s3://{s3_bucket}/builds/x/probe.json") == {"b": 2}
        unsigned = Storage(cfg.model_copy(update={"s3_anonymous": True}))
        with pytest.raises(StorageError, match="access denied"):
            unsigned.read_json(f"s3://{s3_bucket}/builds/x/probe.json")
    seen = {(r["path"].split("/")[1], r["region"]) for r in s3_standin.requests(since)}
    assert seen == {(s3_bucket, "eu-west-1"), (OPENALEX, None), (s3_bucket, None)}
    assert storage.lance_options(f"s3://{OPENALEX}/x")["aws_skip_signature"] == "true"
    assert storage.lance_options(f"s3://{OPENALEX}/x")["aws_region"] == "us-east-1"
    assert "aws_skip_signature" not in storage.lance_options(f"s3://{s3_bucket}/x")
    assert storage.lance_options(f"s3://{s3_bucket}/x")["aws_region"] == "eu-west-1"


def test_the_snapshot_layout_reads_its_parts_and_not_its_manifest(tmp_path: Path):
    """input.openalex as the cluster profile names it (…/data/jsonl): ENTITY/updated_date=…/
    part_….gz, and the snapshot's manifest.json beside them, which is no shard of records."""
    snapshot = tmp_path / "openalex" / "data" / "jsonl"
    for entity in ("works", "sources"):
        parts = sample_dir() / "openalex" / entity
        (snapshot / entity).mkdir(parents=True)
        for part in parts.rglob("*.gz"):
            target = snapshot / entity / part.relative_to(parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(part.read_bytes())
        (snapshot / entity / "manifest.json").write_text('{"entries": []}')
    from cpr_ray.corpus.inputs import discover_inputs

    cluster = load_config("cluster", env={})
    assert cluster.input.openalex == "s3://openalex/data/jsonl"
    assert cluster.storage.for_bucket("openalex").s3_anonymous
    cfg = load_config(
        "dry-run",
        overrides=[f"storage.root={tmp_path / 'root'}", f"input.openalex={snapshot}"],
        env={},
    )
    found = discover_inputs(cfg, Storage(cfg.storage))
    for entity in ("works", "sources"):
        assert [Path(f).name for f in found[entity].files] == ["part_0000.gz"]
