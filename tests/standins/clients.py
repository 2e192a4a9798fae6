"""Handles on the stand-ins, and their starters: what a test or a benchmark holds to drive one
(its URL, its controls, its request log). The servers are this package's other modules, each run
as a child process (`launch.start_local_server`)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.builds import OLD, REPO
from tests.standins.launch import post_json, standin, start_local_server

HERE = Path(__file__).resolve().parent


class S3Standin:
    """Handle on tests/standins/s3_server.py: moto's server, every request recorded, and an IAM
    policy
    enforced on one access key while `enforce` is open."""

    def __init__(self, url: str, log: Path) -> None:
        self.url = url
        self.log = log

    def _post(self, path: str, payload: object) -> None:
        post_json(f"{self.url}{path}", payload)

    def mark(self) -> int:
        """A position in the log: `requests(mark)` is what came after it."""
        return len(self.log.read_bytes().splitlines()) if self.log.exists() else 0

    def requests(self, since: int = 0) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines()[since:]]

    @contextmanager
    def enforce(
        self,
        access_key: str,
        policy: dict,
        public_buckets: tuple[str, ...] = (),
        not_found: str = "bucket",
    ) -> Iterator[None]:
        """`not_found`: what a GET/HEAD of a missing key needs for a 404
        (tests/standins/iam_policy.py's
        `not_found_need`); by default the stricter reading, where the shipped policy gets 403."""
        self._post(
            "/_standin/enforce",
            {
                "access_key": access_key,
                "policy": policy,
                "public_buckets": list(public_buckets),
                "not_found": not_found,
            },
        )
        try:
            yield
        finally:
            self._post("/_standin/clear", {})


def start_s3_standin(folder: Path) -> tuple[subprocess.Popen, S3Standin]:
    """moto's server (s3_server.py) on loopback, its requests logged under `folder`."""
    log = folder / "requests.jsonl"
    proc, url = start_local_server(
        [sys.executable, str(HERE / "s3_server.py"), "--port", "{port}", "--log", str(log)],
        "/moto-api/",
        folder / "moto.log",
    )
    return proc, S3Standin(url, log)


class S3Faults:
    """Handle on tests/standins/s3_faults.py: a fault-injecting proxy in front of the S3
    stand-in."""

    def __init__(self, url: str) -> None:
        self.url = url

    def start(
        self,
        seed: int = 0,
        max_faults: int = 100,
        for_s: float = 600,
        match: str | None = None,
        skip: int = 0,
        **shares: float,
    ):
        """Fail that share of requests with each kind (slowdown, internal, reset), at random,
        at most `max_faults` in all and within `for_s` seconds; with `match`, only of the
        requests whose "METHOD /path?query" the regex finds, after the first `skip` of them."""
        post_json(
            f"{self.url}/_faults",
            {"seed": seed, "max_faults": max_faults, "for_s": for_s, "match": match,
             "skip": skip, **shares},
        )  # fmt: skip

    def clear(self) -> None:
        post_json(f"{self.url}/_faults/clear", {})
        self.release()

    def hold(self, match: str) -> None:
        """Hold every request whose "METHOD /path?query" `match` finds until `release`."""
        post_json(f"{self.url}/_hold", {"match": match})

    def release(self) -> None:
        post_json(f"{self.url}/_hold/release", {})

    def stats(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/_stats", timeout=10) as resp:
            return json.loads(resp.read())


def start_s3_faults(upstream: str, log: Path) -> tuple[subprocess.Popen, S3Faults]:
    """The fault proxy (s3_faults.py) in front of the S3 stand-in at `upstream`."""
    proc, url = start_local_server(
        [sys.executable, str(HERE / "s3_faults.py"), "--port", "{port}", "--upstream", upstream],
        "/_stats",
        log,
    )
    return proc, S3Faults(url)


class ScriptedLLM:
    """Handle on the scripted OpenAI-compatible server (tests/standins/scripted_llm.py)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.base_url = f"{url}/v1"

    def _post(self, path: str, payload: object) -> object:
        import json

        req = urllib.request.Request(
            f"{self.url}{path}",
            data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def reset(self) -> None:
        self._post("/_reset", {})

    def faults(self, *faults: dict) -> None:
        self._post("/_faults", list(faults))

    def pause(self) -> None:
        """Hold every request until `resume`."""
        self._post("/_pause", {})

    def resume(self) -> None:
        self._post("/_resume", {})

    def latency(self, ms: float) -> None:
        self._post("/_latency", {"ms": ms})

    def fault_rates(self, seed: int = 0, **rates: float) -> None:
        """Answer that share of requests with each fault kind, at random: `fault_rates(**{"429":
        0.01, "500": 0.01})`."""
        self._post("/_fault_rates", {"seed": seed, **rates})

    def negatives(self, score: int) -> None:
        """Grade passages judged without mappings (N2 negatives) `score`, as a real model
        grades most pooled candidates, so a negatives walk ends in a round or two."""
        self._post("/_negatives", {"score": score})

    def prompt_cache(self, tokens: int) -> None:
        """Report up to `tokens` of every answered prompt as served from a prompt cache
        (`usage.prompt_tokens_details.cached_tokens`), as vLLM and hosted providers do."""
        self._post("/_prompt_cache", {"tokens": tokens})

    def prompts(self) -> list[str]:
        """Every chat request's prompt since the last reset, in the order they came."""
        return self._post("/_prompts", {})  # type: ignore[return-value]

    def stats(self) -> dict:
        import json

        with urllib.request.urlopen(f"{self.url}/_stats", timeout=10) as resp:
            return json.loads(resp.read())


def start_scripted_llm(log: Path) -> tuple[subprocess.Popen, ScriptedLLM]:
    proc, url = start_local_server(
        [*standin("scripted_llm"), "--port", "{port}"], "/health", log, cwd=REPO
    )
    return proc, ScriptedLLM(url)


class S2StandIn:
    """Handle on `tests/standins/s2_api.py`: the fixture folder it serves, and its controls."""

    API_KEY = "s2-test-key-0c7a"  # what the stand-in demands in x-api-key

    def __init__(self, url: str, root: Path) -> None:
        self.url = url
        self.api_url = f"{url}/datasets/v1"
        self.root = root

    def _post(self, path: str, payload: object) -> None:
        post_json(f"{self.url}{path}", payload)

    def faults(self, *faults: dict) -> None:
        self._post("/_faults", list(faults))

    def stall(self, match: str) -> None:
        self._post("/_stall", {"match": match})

    def reset(self) -> None:
        self._post("/_reset", {})

    def stats(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/_stats", timeout=10) as resp:
            return json.loads(resp.read())


# where the stand-in's pre-signed file URLs point: another host than the API's, as S3 is S2's
S2_FILES_HOST = "127.0.0.2"


def start_s2_standin(root: Path, log: Path) -> tuple[subprocess.Popen, S2StandIn]:
    """A Datasets API stand-in serving `root` (one release until a diff is added), its files
    from `S2_FILES_HOST`."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "releases.json").write_text(json.dumps([OLD]))
    proc, url = start_local_server(
        [
            *standin("s2_api"),
            "--root",
            str(root),
            "--port",
            "{port}",
            "--api-key",
            S2StandIn.API_KEY,
            "--files-host",
            S2_FILES_HOST,
        ],
        "/_stats",
        log,
        cwd=REPO,
    )
    return proc, S2StandIn(url, root)
