"""What S3 answers that is worth asking again, and how often this process asked again.

At cluster scale S3 throttles a share of requests (503 SlowDown), fails some (500) and resets
connections. Every client retries those with backoff, `storage.max_retries` times (pyarrow's
filesystem, boto3, Lance: configured in `storage`); what no client retries is an answer broken
off mid-body, which `Storage` reads again (reads only: a write may have landed). boto3's retries
and those re-reads are counted here for the stage summaries; pyarrow's and Lance's own retries
expose no count.
"""

from __future__ import annotations

import re
from typing import Any

_RETRIES = {"boto3": 0, "storage": 0}
# how pyarrow, botocore and Lance word an answer S3 broke off mid-body (not a refused connection,
# which each client has retried already)
BROKEN_OFF = re.compile(
    r"flush response stream|reading from response stream|connection broken|response body error",
    re.I,
)


def storage_retries() -> int:
    """Requests sent again in this process so far: boto3's retries and `Storage`'s reads read
    again."""
    return sum(_RETRIES.values())


def read_again() -> None:
    """Count one read `Storage` sends again."""
    _RETRIES["storage"] += 1


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
