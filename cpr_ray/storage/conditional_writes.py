"""The two backends of `Storage`'s conditional writes (`read_tagged`, `write_if`, `delete_if`):
S3 through boto3 (same endpoint, region and credentials chain), local files through a hard link
and a file lock."""

from __future__ import annotations

import fcntl
import hashlib
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

from cpr_ray.storage.s3_retries import count_boto_retry


@cache
def boto_client(
    endpoint: str | None,
    region: str | None,
    virtual: bool,
    anonymous: bool,
    max_retries: int,
    timeout_s: float | None = None,
) -> Any:
    """One boto3 client per S3 setting, made from its own session (boto3's default session is
    not thread-safe; a client is); the same timeouts and retries as the pyarrow filesystem
    (`timeout_s`: the connect and read timeouts instead), and a hook that counts the retries."""
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config as BotoConfig

    config = BotoConfig(
        connect_timeout=5 if timeout_s is None else timeout_s,
        read_timeout=60 if timeout_s is None else timeout_s,
        retries={"max_attempts": max_retries + 1, "mode": "standard"},
        s3={"addressing_style": "virtual" if virtual else "path"},
        **({"signature_version": UNSIGNED} if anonymous else {}),
    )
    client = boto3.session.Session().client(
        "s3", endpoint_url=endpoint, region_name=region, config=config
    )
    client.meta.events.register("request-created.s3", count_boto_retry)
    return client


def boto_errors() -> tuple[type[Exception], ...]:
    """botocore's errors (imported when an S3 call has failed, not with this module)."""
    from botocore.exceptions import BotoCoreError, ClientError

    return ClientError, BotoCoreError


def condition_outcome(exc: Exception) -> str | None:
    """'failed' for a condition S3 refused (412, or 409: a conflicting conditional write in
    flight, which the caller re-reads and judges again), 'missing' for no such key, else None."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    code = response.get("Error", {}).get("Code")
    if status in (409, 412) or code in ("PreconditionFailed", "ConditionalRequestConflict"):
        return "failed"
    if status == 404 or code in ("NoSuchKey", "404"):
        return "missing"
    return None


def md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


@contextmanager
def _file_lock(path: str) -> Iterator[None]:
    """An exclusive lock on `path` for a compare-and-replace, held on a hidden sidecar (listings
    skip dot files) so the file itself can be replaced or removed under it."""
    folder, name = os.path.split(path)
    with open(os.path.join(folder, f".{name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def local_write_if(path: str, data: bytes, tag: str | None) -> str | None:
    folder, name = os.path.split(path)
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    try:
        if tag is None:
            try:
                os.link(tmp, path)  # atomic, and only where the name is free
            except FileExistsError:
                return None
            return md5(data)
        with _file_lock(path):
            try:
                with open(path, "rb") as f:
                    if md5(f.read()) != tag:
                        return None
            except FileNotFoundError:
                return None
            os.replace(tmp, path)
            return md5(data)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def local_delete_if(path: str, tag: str) -> bool:
    with _file_lock(path):
        try:
            with open(path, "rb") as f:
                if md5(f.read()) != tag:
                    return False
            os.unlink(path)
        except FileNotFoundError:
            return False
    return True
