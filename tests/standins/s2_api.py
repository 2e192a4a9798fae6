"""A Semantic Scholar Datasets API stand-in on loopback, for tests and benchmarks.

It stands in for the external service only: the client, the refresh and the tables under test
are real. It serves, in the API's documented JSON shapes, what a fixture folder holds:

    ROOT/releases.json                      ["2026-11-25", "2026-12-02", ...]
    ROOT/diffs/{from}/{to}/{dataset}/update-*.jsonl.gz and delete-*.jsonl.gz

- ``GET /datasets/v1/release/`` → the release ids; ``/release/latest`` → ``{"release_id", …}``
- ``GET /datasets/v1/diffs/{start}/to/{end|latest}/{dataset}`` → ``{"dataset",
  "start_release", "end_release", "diffs": [{"from_release", "to_release", "update_files",
  "delete_files"}]}``, the files as URLs with a fake expiring signature in the query string
  (``X-Amz-Signature=`` the ``--signature`` text, default ``secret``, and a request count).
- ``GET /files/...`` → a file's bytes.

With ``--api-key K`` every API request must carry ``x-api-key: K`` (else 403). With
``--files-host H`` (e.g. ``127.0.0.2``) the server also listens on H, on the same port, and the
file URLs name H, as S2's name S3: another host, which must never see the key. Any request to
a host other than the API's (``--host``) is answered without a key check and counted
(``elsewhere``), and so is each one that carried ``x-api-key`` all the same
(``key_elsewhere``).

Test controls: ``POST /_faults`` queues faults for the next API requests (``{"kind": "429",
"retry_after": 1}``, ``{"kind": "500"}``, ``{"kind": "307"}``: a redirect to the same path on
the files host), or with ``"on": "files"`` for the next downloads (``{"kind": "403", "on":
"files"}``: a pre-signed URL that expired); ``POST /_stall {"match": "citations"}`` makes
downloads whose path contains the text hang until the process is killed; ``GET /_stats``
counts requests by kind and reports whether a key was ever missing; ``POST /_reset`` clears
them.

Run (from the repository root): python -m tests.standins.s2_api --root DIR --port PORT [--api-key K]
[--signature S] [--files-host H]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import Counter
from pathlib import Path

from aiohttp import web

from tests.standins.controls import add_controls


def make_app(
    root: Path,
    api_key: str | None,
    signature: str = "secret",
    *,
    api_host: str = "127.0.0.1",
    files_host: str | None = None,
) -> web.Application:
    state: dict = {"faults": [], "file_faults": [], "stall": [], "stats": Counter(), "bad_key": 0}

    def elsewhere(request: web.Request) -> bool:
        """A request to a host other than the API's, counted with whether it bore the key."""
        if request.url.host == api_host:
            return False
        state["stats"]["elsewhere"] += 1
        if "x-api-key" in request.headers:
            state["stats"]["key_elsewhere"] += 1
        return True

    def fault_response(fault: dict, request: web.Request) -> web.Response:
        state["stats"][f"fault_{fault['kind']}"] += 1
        if fault["kind"] == "307":
            there = request.url.with_host(files_host or api_host)
            return web.Response(status=307, headers={"Location": str(there)})
        headers = {"Retry-After": str(fault["retry_after"])} if "retry_after" in fault else {}
        return web.json_response({"message": "fault"}, status=int(fault["kind"]), headers=headers)

    def releases() -> list[str]:
        return json.loads((root / "releases.json").read_text())

    def check(request: web.Request) -> web.Response | None:
        if elsewhere(request):
            return None
        state["stats"]["api"] += 1
        if api_key is not None and request.headers.get("x-api-key") != api_key:
            state["bad_key"] += 1
            return web.json_response({"message": "Forbidden"}, status=403)
        if state["faults"]:
            return fault_response(state["faults"].pop(0), request)
        return None

    async def release_list(request: web.Request) -> web.Response:
        return check(request) or web.json_response(releases())

    async def release_latest(request: web.Request) -> web.Response:
        latest = releases()[-1]
        return check(request) or web.json_response(
            {"release_id": latest, "README": "stand-in", "datasets": []}
        )

    async def diffs(request: web.Request) -> web.Response:
        refused = check(request)
        if refused:
            return refused
        start, end, dataset = (request.match_info[k] for k in ("start", "end", "dataset"))
        ids = releases()
        end = ids[-1] if end == "latest" else end
        if start not in ids or end not in ids:
            return web.json_response({"message": "unknown release"}, status=404)
        chain = ids[ids.index(start) : ids.index(end) + 1]
        host = f"{files_host}:{request.url.port}" if files_host else request.host
        base = f"http://{host}/files"
        out = []
        for a, b in zip(chain, chain[1:]):
            folder = root / "diffs" / a / b / dataset

            def urls(kind: str, folder: Path = folder, a: str = a, b: str = b) -> list[str]:
                files = sorted(folder.glob(f"{kind}-*.jsonl.gz")) if folder.is_dir() else []
                return [
                    f"{base}/{a}/{b}/{dataset}/{f.name}?X-Amz-Signature={signature}{state['stats']['api']}"
                    for f in files
                ]

            out.append(
                {
                    "from_release": a,
                    "to_release": b,
                    "update_files": urls("update"),
                    "delete_files": urls("delete"),
                }
            )
        return web.json_response(
            {"dataset": dataset, "start_release": start, "end_release": end, "diffs": out}
        )

    async def files(request: web.Request) -> web.StreamResponse:
        rel = request.match_info["path"]
        state["stats"]["file"] += 1
        elsewhere(request)
        if state["file_faults"]:
            return fault_response(state["file_faults"].pop(0), request)
        if any(m in rel for m in state["stall"]):
            state["stats"]["stalled"] += 1
            await asyncio.sleep(3600)
        path = (root / "diffs" / rel).resolve()
        if root.resolve() not in path.parents or not path.is_file():
            return web.Response(status=404)
        return web.Response(body=path.read_bytes(), content_type="application/gzip")

    def queue_faults(body: list[dict]) -> dict:
        for fault in body:
            state["file_faults" if fault.get("on") == "files" else "faults"].append(fault)
        return {"queued": len(state["faults"]) + len(state["file_faults"])}

    def stall(body: dict) -> dict:
        state["stall"].append(body["match"])
        return {"stall": state["stall"]}

    def reset(body: None) -> None:
        state.update(faults=[], file_faults=[], stall=[], stats=Counter(), bad_key=0)

    app = web.Application()
    app.router.add_get("/datasets/v1/release/", release_list)
    app.router.add_get("/datasets/v1/release/latest", release_latest)
    app.router.add_get("/datasets/v1/diffs/{start}/to/{end}/{dataset}", diffs)
    app.router.add_get("/files/{path:.*}", files)
    add_controls(
        app,
        {"faults": queue_faults, "stall": stall, "reset": reset},
        lambda: {**state["stats"], "bad_key": state["bad_key"]},
    )
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--api-key")
    parser.add_argument("--signature", default="secret", help="the fake URL signature's text")
    parser.add_argument("--host", default="127.0.0.1", help="the API's host")
    parser.add_argument("--files-host", help="another loopback address the file URLs name")
    args = parser.parse_args()
    app = make_app(
        args.root, args.api_key, args.signature, api_host=args.host, files_host=args.files_host
    )
    # a stalled download must not hold the shutdown for aiohttp's default minute
    web.run_app(
        app,
        host=[args.host, *([args.files_host] if args.files_host else [])],
        port=args.port,
        print=None,
        shutdown_timeout=1,
    )


if __name__ == "__main__":
    main()
