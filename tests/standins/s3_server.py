"""The tests' S3 endpoint: moto's server behind a middleware that records every request and, when
asked, enforces an IAM policy on one access key as AWS would (tests/standins/iam_policy.py).

    python tests/standins/s3_server.py --port 5000 --log requests.jsonl

Each request is one JSON line in the log: method, path, query, the signing key and region (none
for an unsigned request), the status answered, the permissions it needed and the decision.
Controls (JSON POST bodies): `/_standin/enforce` {"access_key", "policy", "public_buckets",
"not_found"} makes requests signed with that key pass the policy or get 403 AccessDenied, unsigned
ones pass only reads of a public bucket (as a bucket policy open to everyone allows), a
DeleteObjects delete the keys the policy allows and report the others, key by key, and a GET or
HEAD of a missing key answer 403 unless the caller may list (`not_found`: "prefix", the key as
`s3:prefix`, or "bucket", the whole bucket: see `iam_policy.not_found_need`);
`/_standin/clear` ends it.
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
from xml.sax.saxutils import escape

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


def _with_delete_errors(body: bytes, refused: list[str]) -> bytes:
    """A DeleteObjects answer with an AccessDenied error per refused key, as S3 gives them."""
    errors = "".join(
        f"<Error><Key>{escape(k)}</Key><Code>AccessDenied</Code><Message>Access Denied</Message>"
        "</Error>"
        for k in refused
    )
    if b"</DeleteResult>" in body:
        return body.replace(b"</DeleteResult>", f"{errors}</DeleteResult>".encode())
    return (  # nothing left to delete: moto was not asked
        '<?xml version="1.0" encoding="UTF-8"?>'
        f'<DeleteResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">{errors}</DeleteResult>'
    ).encode()


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

    def _refused_deletes(self, key_id: str | None, req: S3Request) -> list[str]:
        """The keys of a DeleteObjects that the policy does not let this caller delete: S3
        checks `s3:DeleteObject` per key, deletes the others and lists these as errors."""
        return [
            k
            for k in req.delete_keys
            if self._decide(
                key_id, req, [Need("s3:DeleteObject", f"arn:aws:s3:::{req.bucket}/{k}")]
            )
            != ALLOW
        ]

    @staticmethod
    def _keep_only(environ: dict[str, Any], req: S3Request, refused: list[str]) -> None:
        """Rewrite the DeleteObjects body without the refused keys (the SDK's checksum of the
        old body dropped with it), so moto deletes only what S3 would."""
        root = ET.fromstring(environ["wsgi.input"].read())
        quiet = any(el.tag.endswith("Quiet") and el.text == "true" for el in root)
        kept = "".join(
            f"<Object><Key>{escape(k)}</Key></Object>" for k in req.delete_keys if k not in refused
        )
        body = (
            f'<Delete xmlns="http://s3.amazonaws.com/doc/2006-03-01/">{kept}'
            f"<Quiet>{str(quiet).lower()}</Quiet></Delete>"
        ).encode()
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        for name in [n for n in environ if n == "HTTP_CONTENT_MD5" or "CHECKSUM" in n]:
            del environ[name]

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
        refused_keys: list[str] = []
        try:
            wanted = needs(req)
            if req.delete_keys and self.rules is not None:
                refused_keys = self._refused_deletes(key_id, req)
                if refused_keys:  # S3 deletes the rest and reports these, key by key
                    self._keep_only(environ, req, refused_keys)
                    wanted = [n for n in wanted if n.resource.split("/", 1)[1] not in refused_keys]
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
            if refused_keys and len(refused_keys) == len(req.delete_keys):
                status, headers, body = "200 OK", [("Content-Type", "application/xml")], [b""]
            else:
                with self.conditional if one_at_a_time else nullcontext():
                    status, headers, body = self._forward(environ)
            if refused_keys:
                body = [_with_delete_errors(b"".join(body), refused_keys)]
                headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
                decision = f"{decision}; per key, refused {len(refused_keys)}"
            missing = not_found_need(req, (self.rules or {}).get("not_found", "prefix"))
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
