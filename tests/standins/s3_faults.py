"""A fault-injecting reverse proxy in front of the tests' S3 endpoint: what S3 does at cluster
scale, on loopback.

    python tests/standins/s3_faults.py --port 5001 --upstream http://127.0.0.1:5000

Every request goes on to `--upstream` (tests/standins/s3_server.py) as it came, except a seeded
share:
- `slowdown`: answered `503 SlowDown` with S3's XML error body, never forwarded;
- `internal`: answered `500 InternalError`, never forwarded;
- `reset`: forwarded (so the store has done it), then the connection is reset (RST) after half
  of the answer's body, or before any answer when it has none (a PUT's, a DELETE's, a HEAD's):
  the caller cannot tell whether its write landed, which is what makes a retried conditional
  write unsafe.

Faults are bounded: at most `max_faults` in all, only within `for_s` seconds of the schedule's
start; with `match` (a regex), only requests whose "METHOD /path?query" it finds are drawn, and
the first `skip` of those pass. Controls: POST `/_faults` {"seed", "slowdown", "internal",
"reset" (shares of requests), "max_faults", "for_s", "match", "skip"} starts a schedule (and
zeroes the counts); POST `/_faults/clear` ends it; POST `/_hold` {"match"} holds every request
whose "METHOD /path?query" the regex finds, unanswered, until POST `/_hold/release` (a store
that hangs, or a holder paused mid-call), and then forwards it (`held` in the stats counts the
requests held so far);
GET `/_stats` answers {"requests", "faults": {kind: n}, "faulted": [[kind, method, path?query],
…]}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import socket
import struct
import time
from typing import Any

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web
from yarl import URL

KINDS = ("slowdown", "internal", "reset")
ERRORS = {
    "slowdown": (503, "SlowDown", "Please reduce your request rate."),
    "internal": (500, "InternalError", "We encountered an internal error. Please try again."),
}
MID_BODY_S = 0.05
# hop-by-hop headers, and those aiohttp sets itself from the body it sends
DROP = {"connection", "keep-alive", "transfer-encoding", "content-length", "expect", "upgrade"}


class Schedule:
    """Which requests fail, and how: a seeded draw per request, until the cap or the time is up."""

    def __init__(self) -> None:
        self.rates: dict[str, float] = {}
        self.rng = random.Random(0)
        self.max_faults = 0
        self.until = 0.0
        self.requests = 0
        self.counts = dict.fromkeys(KINDS, 0)
        self.faulted: list[tuple[str, str, str]] = []
        self.match: re.Pattern[str] | None = None
        self.skip = 0

    def start(self, cfg: dict[str, Any]) -> None:
        self.rates = {k: float(cfg.get(k, 0)) for k in KINDS}
        self.rng = random.Random(cfg.get("seed", 0))
        self.max_faults = int(cfg.get("max_faults", 100))
        self.until = time.monotonic() + float(cfg.get("for_s", 600))
        self.requests = 0
        self.counts = dict.fromkeys(KINDS, 0)
        self.faulted = []
        self.match = re.compile(cfg["match"]) if cfg.get("match") else None
        self.skip = int(cfg.get("skip", 0))

    def clear(self) -> None:
        self.rates = {}

    def draw(self, method: str, path: str) -> str | None:
        self.requests += 1
        if not self.rates or sum(self.counts.values()) >= self.max_faults:
            return None
        if time.monotonic() > self.until:
            return None
        if self.match and not self.match.search(f"{method} {path}"):
            return None
        if self.skip:
            self.skip -= 1
            return None
        roll = self.rng.random()
        for kind in KINDS:
            roll -= self.rates[kind]
            if roll < 0:
                self.counts[kind] += 1
                self.faulted.append((kind, method, path))
                return kind
        return None

    def stats(self) -> dict[str, Any]:
        return {"requests": self.requests, "faults": self.counts, "faulted": self.faulted}


def _error(kind: str, path: str) -> web.Response:
    status, code, message = ERRORS[kind]
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<Resource>{path}</Resource><RequestId>fault-{kind}</RequestId></Error>"
    )
    return web.Response(status=status, body=body.encode(), content_type="application/xml")


def _reset(request: web.Request) -> None:
    """End the connection with a TCP reset, not a clean close."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def make_app(upstream: str) -> web.Application:
    schedule = Schedule()
    state: dict[str, ClientSession] = {}

    async def session() -> ClientSession:
        if "s" not in state:
            state["s"] = ClientSession(
                connector=TCPConnector(limit=64),
                timeout=ClientTimeout(total=120),
                auto_decompress=False,
            )
        return state["s"]

    held: dict[str, Any] = {"match": None, "released": asyncio.Event(), "count": 0}

    async def control(request: web.Request) -> web.Response:
        if request.method == "POST" and request.path == "/_faults":
            schedule.start(json.loads(await request.read() or b"{}"))
        elif request.method == "POST" and request.path == "/_faults/clear":
            schedule.clear()
        elif request.method == "POST" and request.path == "/_hold":
            held["match"] = re.compile(json.loads(await request.read())["match"])
            if held["released"].is_set():  # requests held already stay held
                held["released"] = asyncio.Event()
        elif request.method == "POST" and request.path == "/_hold/release":
            held["match"] = None
            held["released"].set()
        return web.json_response({**schedule.stats(), "held": held["count"]})

    async def proxy(request: web.Request) -> web.StreamResponse:
        if request.path in ("/_faults", "/_faults/clear", "/_stats", "/_hold", "/_hold/release"):
            return await control(request)
        body = await request.read()
        if held["match"] is not None and held["match"].search(
            f"{request.method} {request.path_qs}"
        ):
            held["count"] += 1
            await held["released"].wait()
        kind = schedule.draw(request.method, request.path_qs)
        if kind in ERRORS:
            return _error(kind, request.path)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in DROP}
        client = await session()
        async with client.request(
            request.method,
            URL(upstream + request.raw_path, encoded=True),
            headers=headers,
            data=body,
            allow_redirects=False,
        ) as up:
            payload = await up.read()
            out_headers = {k: v for k, v in up.headers.items() if k.lower() not in DROP}
            length = int(up.headers.get("Content-Length", len(payload)))
            status = up.status
        with_body = request.method != "HEAD" and payload
        if kind == "reset" and not with_body:  # done at the store, and no answer at all
            _reset(request)
            return web.Response(status=status)  # never sent: the connection is gone
        out = web.StreamResponse(status=status, headers=out_headers)
        out.content_length = length if request.method == "HEAD" else len(payload)
        await out.prepare(request)
        if kind == "reset":
            await out.write(payload[: len(payload) // 2])
            # the caller has the headers and half the body when the reset comes: a reset at
            # once can overtake them, and the caller sees a refused request (which it retries)
            await asyncio.sleep(MID_BODY_S)
            _reset(request)
            return out
        if request.method != "HEAD":
            await out.write(payload)
        await out.write_eof()
        return out

    app = web.Application(client_max_size=1024**3)
    app.router.add_route("*", "/{tail:.*}", proxy)
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    web.run_app(make_app(args.upstream.rstrip("/")), host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
