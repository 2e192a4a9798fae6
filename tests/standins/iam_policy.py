"""A small evaluator of AWS IAM identity policies, and the S3 request → IAM action mapping, for
the S3 stand-in (tests/standins/s3_server.py) to enforce `infra/iam-policy.json` as AWS would.

Ours because no kept library evaluates a request against a policy: policyuniverse, policyglass,
parliament, cloudsplaining and policy_sentry parse, expand, lint or generate policies, and moto's
own evaluator (moto/iam/access_control.py) reads no condition key, so it denies every
`s3:ListBucket` under a statement with an `s3:prefix` condition (and treats a failed condition
as an explicit Deny). What is covered here is what the shipped policy uses, and anything else
raises instead of guessing: Effect Allow/Deny (an explicit Deny wins), Action/NotAction
(case-insensitive, `*` and `?`), Resource/NotResource, and the String condition operators with
`IfExists`. The S3 rules follow AWS's documentation of each operation's permissions, including
the one that bites prefix-limited policies: a GET or HEAD of a missing key answers 404 only to a
caller allowed `s3:ListBucket` with `s3:prefix` = that key, and 403 otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote

ALLOW, EXPLICIT_DENY, IMPLICIT_DENY = "allow", "explicit-deny", "implicit-deny"


@dataclass(frozen=True)
class Need:
    """One permission an S3 request needs: an action on a resource, with its condition keys."""

    action: str
    resource: str
    context: Mapping[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        extra = "".join(f" {k}={v!r}" for k, v in sorted(self.context.items()))
        return f"{self.action} {self.resource}{extra}"


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _wildcard(pattern: str, *, case: bool) -> re.Pattern[str]:
    if "${" in pattern:
        raise NotImplementedError(f"policy variables are not evaluated here: {pattern!r}")
    body = "".join(".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern)
    # IAM's `*` and `?` match any character, a newline too (an S3 key may hold one), and the
    # pattern covers the whole value: DOTALL, and fullmatch where `$` would also match before a
    # trailing newline
    return re.compile(body, re.DOTALL if case else re.DOTALL | re.IGNORECASE)


def _matches(patterns: Any, value: str, *, case: bool) -> bool:
    return any(_wildcard(p, case=case).fullmatch(value) for p in _as_list(patterns))


_STRING_OPS = {
    "StringEquals": (lambda v, p: v == p, False),
    "StringNotEquals": (lambda v, p: v == p, True),
    "StringEqualsIgnoreCase": (lambda v, p: v.lower() == p.lower(), False),
    "StringNotEqualsIgnoreCase": (lambda v, p: v.lower() == p.lower(), True),
    "StringLike": (lambda v, p: bool(_wildcard(p, case=True).fullmatch(v)), False),
    "StringNotLike": (lambda v, p: bool(_wildcard(p, case=True).fullmatch(v)), True),
}


def _condition_holds(operator: str, key: str, values: Any, context: Mapping[str, str]) -> bool:
    """One operator on one key. A key absent from the request makes a positive operator false
    and a negated one true; `…IfExists` makes it true either way."""
    name, if_exists = (
        (operator[: -len("IfExists")], True) if operator.endswith("IfExists") else (operator, False)
    )
    if name not in _STRING_OPS:
        raise NotImplementedError(f"condition operator {operator!r} is not evaluated here")
    test, negated = _STRING_OPS[name]
    # condition key names are case-insensitive in IAM (`s3:Prefix` is `s3:prefix`); their
    # values are compared as the operator says
    given = {k.lower(): v for k, v in context.items()}
    if key.lower() not in given:
        return if_exists or negated
    hit = any(test(given[key.lower()], str(p)) for p in _as_list(values))
    return not hit if negated else hit


def _statement_applies(st: Mapping[str, Any], need: Need) -> bool:
    if "Principal" in st or "NotPrincipal" in st:
        raise NotImplementedError("a resource policy's Principal is not evaluated here")
    if "Action" in st:
        acts = _matches(st["Action"], need.action, case=False)
    else:
        acts = not _matches(st["NotAction"], need.action, case=False)
    if "Resource" in st:
        res = _matches(st["Resource"], need.resource, case=True)
    else:
        res = not _matches(st["NotResource"], need.resource, case=True)
    if not (acts and res):
        return False
    return all(
        _condition_holds(op, key, values, need.context)
        for op, keys in st.get("Condition", {}).items()
        for key, values in keys.items()
    )


def evaluate(policy: Mapping[str, Any], need: Need) -> str:
    """`allow`, `explicit-deny` or `implicit-deny` for one need under one identity policy."""
    decision = IMPLICIT_DENY
    for st in _as_list(policy["Statement"]):
        if _statement_applies(st, need):
            if st["Effect"] == "Deny":
                return EXPLICIT_DENY
            decision = ALLOW
    return decision


# -- S3 requests → the permissions they need ---------------------------------------------------


@dataclass(frozen=True)
class S3Request:
    """An HTTP request to the S3 stand-in, as the recorder sees it (path-style addressing)."""

    method: str
    path: str  # /bucket[/key], percent-decoded
    query: str = ""
    copy_source: str | None = None  # x-amz-copy-source
    delete_keys: Sequence[str] = ()  # the keys of a DeleteObjects body

    @property
    def bucket(self) -> str:
        return self.path.lstrip("/").split("/", 1)[0]

    @property
    def key(self) -> str:
        parts = self.path.lstrip("/").split("/", 1)
        return parts[1] if len(parts) > 1 else ""


def _obj(bucket: str, key: str) -> str:
    return f"arn:aws:s3:::{bucket}/{key}"


def needs(req: S3Request) -> list[Need]:
    """The permissions one S3 request needs (AWS's table of operations → actions); a request
    this does not know raises, so a new kind of call is looked at rather than passed."""
    q = parse_qs(req.query, keep_blank_values=True)
    bucket_arn = f"arn:aws:s3:::{req.bucket}"
    if not req.key:
        if req.method == "HEAD":  # HeadBucket
            return [Need("s3:ListBucket", bucket_arn)]
        if req.method == "GET" and set(q) <= {
            "list-type",
            "prefix",
            "delimiter",
            "max-keys",
            "continuation-token",
            "start-after",
            "marker",
            "encoding-type",
            "fetch-owner",
        }:  # ListObjects(V2): the prefix, when given, is the condition key s3:prefix
            context = {"s3:prefix": q["prefix"][0]} if "prefix" in q else {}
            return [Need("s3:ListBucket", bucket_arn, context)]
        if req.method == "GET" and "uploads" in q:
            return [Need("s3:ListBucketMultipartUploads", bucket_arn)]
        if req.method == "GET" and "location" in q:
            return [Need("s3:GetBucketLocation", bucket_arn)]
        if req.method == "POST" and "delete" in q:
            return [Need("s3:DeleteObject", _obj(req.bucket, k)) for k in req.delete_keys]
        if req.method == "PUT" and not q:
            return [Need("s3:CreateBucket", bucket_arn)]
        raise ValueError(f"unmapped S3 bucket request {req.method} {req.path}?{req.query}")
    obj = _obj(req.bucket, req.key)
    if req.method in ("GET", "HEAD") and "uploadId" in q:
        return [Need("s3:ListMultipartUploadParts", obj)]
    if req.method in ("GET", "HEAD") and set(q) <= {"partNumber", "versionId"}:
        # reading a given version is its own action: GetObject alone reads only the current one
        return [Need("s3:GetObjectVersion" if "versionId" in q else "s3:GetObject", obj)]
    if req.method == "PUT" and set(q) <= {"partNumber", "uploadId"}:  # Put/Copy, UploadPart(Copy)
        out = [Need("s3:PutObject", obj)]
        if req.copy_source:
            src = unquote(req.copy_source.split("?", 1)[0]).lstrip("/")
            out.append(Need("s3:GetObject", f"arn:aws:s3:::{src}"))
        return out
    if req.method == "POST" and ("uploads" in q or "uploadId" in q):  # Create/Complete MPU
        return [Need("s3:PutObject", obj)]
    if req.method == "DELETE" and "uploadId" in q:
        return [Need("s3:AbortMultipartUpload", obj)]
    if req.method == "DELETE" and not q:
        return [Need("s3:DeleteObject", obj)]
    if req.method == "DELETE" and set(q) == {"versionId"}:
        return [Need("s3:DeleteObjectVersion", obj)]
    raise ValueError(f"unmapped S3 object request {req.method} {req.path}?{req.query}")


NOT_FOUND_RULES = ("prefix", "bucket")


def not_found_need(req: S3Request, rule: str = "prefix") -> Need | None:
    """What a GET or HEAD of a missing key needs to be told 404 rather than 403: `s3:ListBucket`
    on the bucket. AWS documents that much and not whether a condition on `s3:prefix` is
    evaluated for this implied check, so both readings are here: `prefix`, the key as
    `s3:prefix` (Ceph's RGW matched it in 2026), and `bucket`, the request carrying no prefix, so
    a prefix-limited grant does not apply and the answer is 403."""
    if rule not in NOT_FOUND_RULES:
        raise ValueError(f"unknown not-found rule {rule!r}")
    if req.key and req.method in ("GET", "HEAD"):
        context = {"s3:prefix": req.key} if rule == "prefix" else {}
        return Need("s3:ListBucket", f"arn:aws:s3:::{req.bucket}", context)
    return None


def render(policy_text: str, bucket: str) -> str:
    """The shipped policy for another bucket name, as infra/README.md's `render` does."""
    return policy_text.replace("my-cpr-bucket", bucket)
