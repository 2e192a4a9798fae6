"""The tests' S3 endpoint: moto's server behind a middleware that records every request and, when
asked, enforces an IAM policy on one access key as AWS would (tests/iam_policy.py).

    python tests/s3_standin.py --port 5000 --log requests.jsonl

Each request is one JSON line in the log: method, path, query, the signing key and region (none
for an unsigned request), the status answered, the permissions it needed and the decision.
Controls (JSON POST bodies): `/_standin/enforce` {"access_key", "policy", "public_buckets"} makes
requests signed with that key pass the policy or get 403 AccessDenied, unsigned ones pass only
reads of a public bucket (as a bucket policy open to everyone allows), and a GET or HEAD of a
missing key answer 403 unless the caller may list that key's prefix; `/_standin/clear` ends it.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import threading
import xml.etree.ElementTree as ET
from contextlib import nullcontext
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from iam_policy import (
    ALLOW,
    Need,
    S3Request,
    evaluate,
    needs,
    not_found_need,
)

SCOPE = re.compile(r"Credential=([^/]+)/\d+/([^/]+)/")
READS = ("s3:GetObject", "s3:ListBucket")


def _denied(method: str, resource: str) -> tuple[str, list[tuple[str, str]], list[bytes]]:
    body = (
        b""
        if method == "HEAD"
        else (
            '<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
            f"<Message>Access Denied</Message><Resource>{resource}</Resource></Error>"
        ).encode()
    )
    return "403 Forbidden", [("Content-Type", "application/xml")], [body]


class Standin:
    def __init__(self, app: Any, log: Path) -> None:
        self.app = app
        self.log = log
        self.lock = threading.Lock()
        self.conditional = threading.Lock()
        self.rules: dict[str, Any] | None = None

    # -- controls --------------------------------------------------------------------------
    def _control(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        payload = json.loads(environ["wsgi.input"].read(length) or b"{}")
        with self.lock:
            if environ["PATH_INFO"] == "/_standin/enforce":
                self.rules = payload
            elif environ["PATH_INFO"] == "/_standin/clear":
                self.rules = None
        start_response("200 OK", [("Content-Type", "application/json")])
        return [b"{}"]

    # -- requests ----------------------------------------------------------------------------
    def _request(self, environ: dict[str, Any]) -> S3Request:
        query = environ.get("QUERY_STRING", "")
        delete_keys: list[str] = []
        if environ["REQUEST_METHOD"] == "POST" and re.search(r"(^|&)delete(=|&|$)", query):
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = environ["wsgi.input"].read(length)
            environ["wsgi.input"] = io.BytesIO(body)
            root = ET.fromstring(body)
            delete_keys = [el.text or "" for el in root.iter() if el.tag.endswith("Key")]
        return S3Request(
            environ["REQUEST_METHOD"],
            unquote(environ.get("PATH_INFO", "")),
            query,
            environ.get("HTTP_X_AMZ_COPY_SOURCE"),
            tuple(delete_keys),
        )

    def _decide(self, key_id: str | None, req: S3Request, wanted: list[Need]) -> str:
        rules = self.rules
        if rules is None:
            return "not-enforced"
        if key_id is None:  # anonymous: only what a public bucket's policy lets everyone do
            public = req.bucket in rules.get("public_buckets", [])
            reads = all(n.action in READS for n in wanted)
            return ALLOW if public and reads else "anonymous-denied"
        if key_id != rules["access_key"]:
            return "not-enforced"  # the operator seeding the test's data
        for need in wanted:
            if (decision := evaluate(rules["policy"], need)) != ALLOW:
                return f"{decision}: {need}"
        return ALLOW

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO", "").startswith("/_standin/"):
            return self._control(environ, start_response)
        auth = environ.get("HTTP_AUTHORIZATION", "")
        scope = SCOPE.search(auth) or SCOPE.search(unquote(environ.get("QUERY_STRING", "")))
        key_id, region = (scope.group(1), scope.group(2)) if scope else (None, None)
        req = self._request(environ)
        try:
            wanted = needs(req)
            decision = self._decide(key_id, req, wanted)
        except (ValueError, NotImplementedError) as exc:
            wanted, decision = [], f"unmapped: {exc}"
        if decision.startswith(("unmapped", "explicit", "implicit", "anonymous")) and self.rules:
            status, headers, body = _denied(req.method, req.path)
        else:
            # S3 checks a write's condition and writes in one step; moto checks, then writes, so
            # two racing writers could both pass: conditional writes go one at a time here
            condition = "HTTP_IF_MATCH" in environ or "HTTP_IF_NONE_MATCH" in environ
            one_at_a_time = condition and req.method in ("PUT", "DELETE")
            with self.conditional if one_at_a_time else nullcontext():
                status, headers, body = self._forward(environ)
            missing = not_found_need(req)
            if status.startswith("404") and missing and decision == ALLOW:
                check = self._decide(key_id, req, [missing])
                if check != ALLOW:  # AWS hides whether the key exists from who may not list it
                    decision = f"404 became 403, {check}"
                    status, headers, body = _denied(req.method, req.path)
        self._record(req, key_id, region, status, wanted, decision)
        start_response(status, headers)
        return body

    def _forward(self, environ: dict[str, Any]) -> tuple[str, list[tuple[str, str]], list[bytes]]:
        seen: dict[str, Any] = {}

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            seen["status"], seen["headers"] = status, headers
            return lambda data: None

        result = self.app(environ, capture)
        try:
            body = [b"".join(result)]
        finally:
            if hasattr(result, "close"):
                result.close()
        return seen["status"], seen["headers"], body

    def _record(
        self,
        req: S3Request,
        key_id: str | None,
        region: str | None,
        status: str,
        wanted: list[Need],
        decision: str,
    ) -> None:
        line = {
            "method": req.method,
            "path": req.path,
            "query": req.query,
            "access_key": key_id,
            "region": region,
            "status": int(status.split()[0]),
            "needs": [
                {"action": n.action, "resource": n.resource, "context": dict(n.context)}
                for n in wanted
            ],
            "decision": decision,
        }
        with self.lock, open(self.log, "a") as f:
            f.write(json.dumps(line) + "\n")


def main() -> None:
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import run_simple

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True)
    args = parser.parse_args()
    app = Standin(DomainDispatcherApplication(create_backend_app), args.log)
    run_simple("127.0.0.1", args.port, app, threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
