"""Failures an operator can read after the cluster is gone.

A stage that fails leaves ``ROOT/_logs/{stage}-{time}-{id}.log`` beside the build, on the same
storage (S3 on a cluster): a header — stage, time, kind (a user's mistake or a bug), the
one-line cause, host, code version — and the whole traceback, a Ray worker's remote traceback
included, with secrets redacted. Ray's session logs, where a worker's traceback otherwise
stays, live on the head, and KubeRay deletes the head minutes after the job. A stage that ends
well (published or skipped) writes ``ROOT/_logs/{stage}.ok.json``, so ``cpr stats ROOT`` shows
a stage's last failure only while no success came after it. The command's last line is the
cause and the record's path (`command_options.crash_line` for a bug; a user's mistake keeps its
own one line).
"""

from __future__ import annotations

import datetime as dt
import os
import re
import socket
import traceback
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ray.exceptions import RayTaskError

from cpr_ray.errors import UserError
from cpr_ray.runs.ray_runtime import traceback_writer, user_error_in, user_message
from cpr_ray.runs.stage_runner import Manifest, code_version
from cpr_ray.storage.store import Storage, join

FOLDER = "_logs"
_RECORD = re.compile(r"^(?P<stage>.+)-(?P<stamp>\d{8}T\d{6}\.\d{3}Z)-[0-9a-f]{6}\.log$")
_OK = ".ok.json"
# environment variables whose values are credentials: the defaults of every *api_key_env, AWS's
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)
# a URL's query string: a pre-signed URL's signature is a credential
_URL_QUERY = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s?#'\"<>]+)\?[^\s'\"<>]*")
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours a worker's name in a remote traceback
_ATTR = "cpr_failure"  # where a recorded exception keeps its `Failure`


@dataclass(frozen=True)
class Failure:
    """One failed stage, as its record's header says."""

    stage: str
    time: str  # UTC, ISO 8601
    kind: str  # "user error" or "bug"
    cause: str  # one line
    log: str  # the record's URI


def secret_names(cfg: Any = None) -> set[str]:
    """Environment variables whose values must never be written: the credential-looking names,
    and every variable a config's `*api_key_env` field names."""
    names = {n for n in os.environ if _SECRET_NAME.search(n)}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key.endswith("api_key_env") and isinstance(value, str):
                    names.add(value)
                walk(value)

    if cfg is not None:
        walk(cfg.model_dump())
    return names


def redact(text: str, names: Iterable[str]) -> str:
    """`text` without the values of the variables `names` (8 characters or more: a shorter one
    is no credential and would blank out ordinary words) and without any URL's query string."""
    values = sorted(
        {v for n in names if len(v := os.environ.get(n, "")) >= 8}, key=len, reverse=True
    )
    for value in values:
        text = text.replace(value, "[redacted]")
    return _URL_QUERY.sub(r"\1?[query redacted]", text)


def _one_line(text: str) -> str:
    return " ".join(text.split())[:500]


def cause_of(exc: BaseException) -> tuple[str, str]:
    """(kind, the one-line cause): a user's mistake by its message, a bug by its type and the
    first line of its message, looked for in the original exception a Ray worker raised."""
    user = user_error_in(exc)
    if user is not None:
        return "user error", _one_line(user_message(user))
    original = exc.cause if isinstance(exc, RayTaskError) and exc.cause is not None else exc
    if isinstance(original, RayTaskError):  # the original could not come back: its text can
        lines = [ln for ln in str(original).splitlines() if ln.strip()]
        return "bug", _one_line(lines[-1] if lines else type(original).__name__)
    lines = [ln for ln in str(original).splitlines() if ln.strip()]
    name = type(original).__name__
    return "bug", _one_line(f"{name}: {lines[0]}" if lines else name)


def traceback_text(exc: BaseException, names: Iterable[str]) -> str:
    """The whole traceback, chained exceptions and a Ray worker's remote traceback included."""
    return redact(_COLOUR.sub("", "".join(traceback.format_exception(exc))), names)


def of(exc: BaseException) -> Failure | None:
    """The record written for `exc`, if one was."""
    return getattr(exc, _ATTR, None)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _iso(at: dt.datetime) -> str:
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _Recorder:
    def __init__(self, storage: Storage, stage: str, names: set[str]) -> None:
        self.storage = storage
        self.stage = stage
        self.names = names

    def write(self, exc: BaseException) -> str:
        """Write the record of `exc` (once) and return where it went; never raises, since the
        failure being reported may be the storage's own."""
        done = of(exc)
        if done is not None:
            return done.log
        now = _now()
        kind, cause = cause_of(exc)
        cause = redact(cause, self.names)
        stamp = f"{now.strftime('%Y%m%dT%H%M%S')}.{now.microsecond // 1000:03d}Z"
        name = f"{self.stage}-{stamp}-{uuid.uuid4().hex[:6]}.log"
        header = {
            "stage": self.stage,
            "time": _iso(now),
            "kind": kind,
            "cause": cause,
            "host": f"{socket.gethostname()} pid {os.getpid()}",
            "code": code_version(),
        }
        text = "".join(f"{k}: {v}\n" for k, v in header.items())
        text += "\n" + traceback_text(exc, self.names)
        try:
            uri = join(self.storage.root, FOLDER, name)
            self.storage.write_text(uri, text)
        except (UserError, OSError):
            uri = os.path.join(os.path.abspath(os.environ.get("TMPDIR", "/tmp")), FOLDER, name)
            try:
                os.makedirs(os.path.dirname(uri), exist_ok=True)
                with open(uri, "w", encoding="utf-8") as f:
                    f.write(text)
            except OSError:
                uri = "nowhere (storage and the local temp folder refused it)"
        failure = Failure(self.stage, header["time"], kind, cause, uri)
        for e in (exc, user_error_in(exc)):
            if e is not None:
                try:
                    setattr(e, _ATTR, failure)
                except AttributeError:  # an exception type without a __dict__
                    pass
        return uri

    def succeeded(self) -> None:
        uri = join(self.storage.root, FOLDER, f"{self.stage}{_OK}")
        try:
            self.storage.write_json(uri, {"stage": self.stage, "time": _iso(_now())})
        except UserError:  # the stage's work is done; stats then shows an older failure
            pass


@contextmanager
def recorded(storage: Storage, stage: str, names: Iterable[str] = ()) -> Iterator[None]:
    """Around one stage: an exception leaving it is recorded under ``ROOT/_logs/`` (and
    re-raised as it was); an error mapped out of Ray inside it (`user_errors_from_ray`) is
    recorded there too, with its Ray traceback. A clean exit records the success."""
    recorder = _Recorder(storage, stage, secret_names() | set(names))
    token = traceback_writer.set(recorder.write)
    try:
        yield
    except Exception as exc:
        recorder.write(exc)
        raise
    else:
        recorder.succeeded()
    finally:
        traceback_writer.reset(token)


def _time(iso: str) -> dt.datetime:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00"))


def last_failures(storage: Storage, manifests: Mapping[str, Manifest]) -> list[Failure]:
    """Each stage's latest failure that no success followed (its `.ok.json`, or for a root
    written before those, its published manifest's end), oldest first."""
    folder = join(storage.root, FOLDER)
    latest: dict[str, tuple[str, str]] = {}
    ok: dict[str, dt.datetime] = {}
    for info in storage.list_files(folder, missing_ok=True):
        base = info.base_name
        if base.endswith(_OK):
            stage = base.removesuffix(_OK)
            ok[stage] = _time(storage.read_json(join(folder, base))["time"])
        elif m := _RECORD.match(base):
            if m["stamp"] > latest.get(m["stage"], ("", ""))[0]:
                latest[m["stage"]] = (m["stamp"], join(folder, base))
    out = []
    for stage, (_, uri) in latest.items():
        failure = read_record(storage, uri)
        manifest = manifests.get(stage)
        if stage not in ok and manifest and manifest.get("started"):
            ok[stage] = _time(manifest["started"]) + dt.timedelta(
                seconds=manifest.get("seconds", 0)
            )
        if stage not in ok or ok[stage] < _time(failure.time):
            out.append(failure)
    return sorted(out, key=lambda f: f.time)


def read_record(storage: Storage, uri: str) -> Failure:
    """A record's header as a `Failure`."""
    header: dict[str, str] = {}
    for line in storage.read_text(uri).splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(": ")
        header[key] = value
    return Failure(
        header.get("stage", "?"),
        header.get("time", "?"),
        header.get("kind", "?"),
        header.get("cause", "?"),
        uri,
    )
