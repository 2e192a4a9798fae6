"""What S3 answers that is worth asking again, and how often this process asked again.

At cluster scale S3 throttles a share of requests (503 SlowDown), fails some (500) and resets
connections. Every client retries those with backoff, `storage.max_retries` times (pyarrow's
filesystem, boto3, Lance: configured in `storage`); what no client retries is an answer broken
off mid-body, which `Storage` sends again (reads, and a Lance commit that did not land).

Counted here for the stage summaries: boto3's retries (its `request-created` hook), Lance's
(the 5xx/429/408 answers its client saw, from Lance's own metrics recorder; the connections it
saw reset and retried inside it have no count) and `Storage`'s own. pyarrow's retries happen in
its C++ AWS client, which reports none to Python: not counted.
"""

from __future__ import annotations

import re
from typing import Any

_RETRIES = {"boto3": 0, "storage": 0}
# Lance's counter of answers worth retrying (HTTP 5xx, 429, 408) seen by its object store client
LANCE_RETRIES = "lance_object_store_retryable_responses_total"
_LANCE = {"counting": False}
# how pyarrow, botocore and Lance word an answer S3 broke off mid-body (not a refused connection,
# which each client has retried already)
BROKEN_OFF = re.compile(
    r"flush response stream|reading from response stream|connection broken|response body error",
    re.I,
)


def storage_retries() -> int:
    """Requests sent again in this process so far: boto3's retries, Lance's answers worth
    retrying, and what `Storage` sent again."""
    return sum(_RETRIES.values()) + lance_retries()


def sent_again() -> None:
    """Count one request `Storage` sends again (a read broken off, a Lance change that did not
    land)."""
    _RETRIES["storage"] += 1


def count_lance_retries() -> None:
    """Install Lance's metrics recorder in this process, once, before its first request: Lance
    counts through it the answers its client retried. (One recorder per process is allowed;
    another library's would leave Lance's retries uncounted, not wrong.)"""
    if not _LANCE["counting"]:
        from lance.lance import register_lance_metrics_recorder

        _LANCE["counting"] = register_lance_metrics_recorder()


def lance_retries() -> int:
    """The 5xx/429/408 answers Lance's client has seen in this process (each one it retried,
    and the last of a request it gave up on, which fails the stage)."""
    if not _LANCE["counting"]:
        return 0
    from lance.lance import snapshot_lance_metrics

    return int(sum(m.value or 0 for m in snapshot_lance_metrics() if m.name == LANCE_RETRIES))


def broken_off(exc: Exception) -> bool:
    """An answer S3 broke off mid-body: worth reading again."""
    return not isinstance(exc, FileNotFoundError) and bool(BROKEN_OFF.search(str(exc)))


def retried(exc: Exception) -> bool:
    """Whether boto3 sent the request that failed more than once (so an earlier attempt may
    have landed)."""
    response = getattr(exc, "response", None) or {}
    return bool(response.get("ResponseMetadata", {}).get("RetryAttempts"))


def count_boto_retry(request: Any, **_: Any) -> None:
    """boto3's `request-created` hook: counts each attempt after the first."""
    if request.context.get("retries", {}).get("attempt", 1) > 1:
        _RETRIES["boto3"] += 1
