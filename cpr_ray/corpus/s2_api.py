"""A client for the Semantic Scholar Datasets API: releases, incremental diffs, file downloads.

The API (``https://api.semanticscholar.org/datasets/v1``) lists releases (``/release/``), and for
a dataset the diffs between two releases (``/diffs/{start}/to/{end}/{dataset}``): one step per
consecutive pair of releases, each with ``update_files`` and ``delete_files`` — pre-signed URLs
of gzipped JSONL that expire, so a rerun asks for them again rather than keeping them.

The key goes in the ``x-api-key`` header of requests to the API's own host and nowhere else:
not to the hosts of the pre-signed download URLs, not along a redirect to another host
(requests drops ``Authorization`` there, but keeps a custom header). It is never logged, and
error messages name a URL without its query string (a pre-signed URL's signature is a
credential too). S2 allows one request a second per key; requests are spaced to that, and a
429 or a 5xx backs off (its ``Retry-After`` when it gives one) before a bounded number of
retries.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO
from urllib.parse import urlsplit, urlunsplit

import requests

from cpr_ray.errors import InputError, StorageError

RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
KEY_HEADER = "x-api-key"


@dataclass(frozen=True)
class DiffStep:
    """One release-to-release step of one dataset's changes."""

    dataset: str
    from_release: str
    to_release: str
    update_files: tuple[str, ...]
    delete_files: tuple[str, ...]


def public_url(url: str) -> str:
    """A URL as it may appear in a message or a log: no query string, no credentials."""
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc = f"{netloc}:{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def origin(url: str) -> tuple[str, str, int | None]:
    """Scheme, host and port (the scheme's default when none is given) of a URL."""
    parts = urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or default


@dataclass(frozen=True)
class FileFetcher:
    """What a Ray task needs to download pre-signed diff files: the client's retry settings and
    no API key (a pre-signed URL carries its own signature, and the key goes to the API's host
    only), so nothing secret travels with the task."""

    max_retries: int
    timeout_s: float
    backoff_s: float

    def download(self, url: str, sink: BinaryIO) -> int:
        client = S2DatasetsClient(
            "",
            None,
            requests_per_second=0,
            max_retries=self.max_retries,
            timeout_s=self.timeout_s,
            backoff_s=self.backoff_s,
        )
        return client.download(url, sink)


class KeyedSession(requests.Session):
    """A session that sets the API key on exactly the requests to one origin, the API's: on the
    first request and again on every hop of a redirect, where it is removed when the hop
    leaves that origin."""

    def __init__(self, api_origin: tuple[str, str, int | None], api_key: str | None) -> None:
        super().__init__()
        self.api_origin = api_origin
        self.api_key = api_key

    def _scope(self, prepared: requests.PreparedRequest) -> None:
        if self.api_key and origin(prepared.url or "") == self.api_origin:
            prepared.headers[KEY_HEADER] = self.api_key
        else:
            prepared.headers.pop(KEY_HEADER, None)

    def prepare_request(self, request: requests.Request) -> requests.PreparedRequest:
        prepared = super().prepare_request(request)
        self._scope(prepared)
        return prepared

    def rebuild_auth(self, prepared: requests.PreparedRequest, response: requests.Response) -> None:
        super().rebuild_auth(prepared, response)
        self._scope(prepared)


class S2DatasetsClient:
    """Spaced, retried GETs against the Datasets API; thread-safe spacing."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        *,
        requests_per_second: float = 1.0,
        max_retries: int = 5,
        timeout_s: float = 60.0,
        backoff_s: float = 2.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.session = KeyedSession(origin(self.base_url), api_key)
        self.interval = 1.0 / requests_per_second if requests_per_second > 0 else 0.0
        self.max_retries = max_retries
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self._sleep = sleep
        self._clock = clock  # with `sleep`, a test's virtual time: spacing is then exact
        self._lock = threading.Lock()
        self._next = 0.0
        self.requests = 0  # every HTTP request sent, retries included

    def _space(self) -> None:
        with self._lock:
            now = self._clock()
            wait = self._next - now
            self._next = max(now, self._next) + self.interval
        if wait > 0:
            self._sleep(wait)

    def _get(self, url: str, *, stream: bool = False, api: bool = True) -> requests.Response:
        """GET with spacing (API calls only: pre-signed file URLs are not the API's quota) and
        back-off on 429/5xx/connection errors; any other error status is final."""
        shown = public_url(url)
        for attempt in range(self.max_retries + 1):
            if api:
                self._space()
            self.requests += 1
            try:
                resp = self.session.get(url, stream=stream, timeout=self.timeout_s)
            except requests.RequestException as exc:
                if attempt == self.max_retries:
                    raise StorageError(
                        f"Semantic Scholar API unreachable at {shown}: {type(exc).__name__} "
                        f"after {attempt + 1} attempts"
                    ) from None
                self._sleep(self.backoff_s * 2**attempt)
                continue
            if resp.status_code in RETRY_STATUS and attempt < self.max_retries:
                retry_after = resp.headers.get("Retry-After")
                resp.close()
                delay = float(retry_after) if retry_after and retry_after.isdigit() else None
                self._sleep(delay if delay is not None else self.backoff_s * 2**attempt)
                continue
            if resp.status_code in (401, 403):
                resp.close()
                raise InputError(
                    f"Semantic Scholar refused {shown} (HTTP {resp.status_code}): set a valid "
                    "API key in the variable named by refresh.api_key_env"
                )
            if resp.status_code == 404:
                resp.close()
                raise InputError(f"Semantic Scholar has no {shown} (HTTP 404)")
            if resp.status_code >= 400:
                resp.close()
                raise StorageError(
                    f"Semantic Scholar answered HTTP {resp.status_code} for {shown}"
                    + (f" after {attempt + 1} attempts" if attempt else "")
                )
            return resp
        raise AssertionError("unreachable")  # the loop returns or raises

    def _json(self, path: str) -> Any:
        url = f"{self.base_url}/{path.lstrip('/')}"
        resp = self._get(url)
        try:
            return resp.json()
        except ValueError:
            raise InputError(
                f"Semantic Scholar answered {public_url(url)} with something that is not JSON"
            ) from None

    def releases(self) -> list[str]:
        """Release ids, oldest first."""
        out = self._json("release/")
        if not isinstance(out, list) or not all(isinstance(r, str) for r in out):
            raise InputError("Semantic Scholar's release list is not a list of release ids")
        return sorted(out)

    def latest(self) -> str:
        out = self._json("release/latest")
        if not isinstance(out, dict) or not isinstance(out.get("release_id"), str):
            raise InputError("Semantic Scholar's latest release has no release_id")
        return out["release_id"]

    def diffs(self, start: str, end: str, dataset: str) -> list[DiffStep]:
        """The steps from release `start` to `end` for `dataset`, in the order to apply them."""
        out = self._json(f"diffs/{start}/to/{end}/{dataset}")
        try:
            steps = [
                DiffStep(
                    dataset,
                    d["from_release"],
                    d["to_release"],
                    tuple(d["update_files"]),
                    tuple(d["delete_files"]),
                )
                for d in out["diffs"]
            ]
        except (KeyError, TypeError):
            raise InputError(
                f"Semantic Scholar's diff listing {start}→{end} for {dataset} lacks "
                "diffs[].from_release/to_release/update_files/delete_files"
            ) from None
        for prev, step in zip(steps, steps[1:]):
            if step.from_release != prev.to_release:
                raise InputError(
                    f"diffs of {dataset} do not chain: {prev.to_release} is followed by a step "
                    f"from {step.from_release}"
                )
        return steps

    def fetcher(self) -> FileFetcher:
        return FileFetcher(self.max_retries, self.timeout_s, self.backoff_s)

    def download(self, url: str, sink: BinaryIO, chunk_bytes: int = 1 << 20) -> int:
        """Stream one diff file into `sink`; returns bytes written."""
        resp = self._get(url, stream=True, api=False)
        written = 0
        try:
            for chunk in resp.iter_content(chunk_bytes):
                sink.write(chunk)
                written += len(chunk)
        except requests.RequestException as exc:
            raise StorageError(
                f"download of {public_url(url)} broke after {written:,} bytes: {type(exc).__name__}"
            ) from None
        finally:
            resp.close()
        expected = resp.headers.get("Content-Length")
        if (
            expected
            and expected.isdigit()
            and int(expected) != written
            and not resp.headers.get("Content-Encoding")
        ):
            raise StorageError(
                f"download of {public_url(url)} ended at {written:,} of {int(expected):,} bytes"
            )
        return written
