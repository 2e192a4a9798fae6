"""The search service: Ray Serve replicas over the same `run_search` as `cpr search`.

``POST /search`` takes ``{"query": "How to …"}`` (or ``"queries": [{"query_id", "query"}, …]``)
and the CLI's options (``k``, ``other_fields_only``, ``field``, ``exclude_fields``, ``before``,
``hybrid``, ``rerank``, ``explain``) and answers ``{"results": [...]}``, each result the JSON line
`cpr search --json` prints. ``GET /healthz`` answers once the index is loaded; ``/docs`` and
``/openapi.json`` describe the API.

What a client sees when it asks too much: 422 with the fields at fault (a malformed body, k over
``search.max_k``, too many queries), 413 for a body over ``search.serve.max_body_bytes``, 401
without the API key (when ``search.serve.api_key_env`` names one), 503 when every replica is busy
and the bounded queue (``max_queued_requests``) is full, and never a stack trace (500 says to
read the service log). Replicas autoscale between ``min_replicas`` and ``max_replicas``.

`cpr serve INDEX` runs it on a local Ray; on a cluster, ``serve deploy infra/serve/search.yaml``
builds it from :func:`app_builder` with the same config keys.
"""

# no `from __future__ import annotations`: FastAPI reads the endpoints' annotations as types in
# the replica, where string annotations would not resolve (cloudpickle carries no module globals)
import hmac
import logging
import os
import signal
import threading
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cpr_ray.config import Config, ServeConfig, load_config
from cpr_ray.errors import ConfigError, UserError

log = logging.getLogger("cpr_ray.search.serve")
QUERY_CHARS = 4000


class QueryIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query_id: str | None = Field(None, max_length=200)
    query: str = Field(min_length=1, max_length=QUERY_CHARS)


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: str | None = Field(None, min_length=1, max_length=QUERY_CHARS)
    queries: list[QueryIn] | None = Field(None, min_length=1)
    k: int | None = Field(None, ge=1)
    other_fields_only: bool = False
    field: str | None = None
    exclude_fields: list[str] = Field(default_factory=list)
    before: int | None = None
    hybrid: bool = False
    rerank: Literal["llm"] | None = None
    explain: bool = False

    @model_validator(mode="after")
    def _one_form(self) -> "SearchRequest":
        if (self.query is None) == (self.queries is None):
            raise ValueError('give "query" or "queries", not both and not neither')
        return self


def api_key(serve_cfg: ServeConfig) -> str | None:
    """The key clients must send, read from the environment variable the config names."""
    if serve_cfg.api_key_env is None:
        return None
    key = os.environ.get(serve_cfg.api_key_env)
    if not key:
        raise ConfigError(
            f"search.serve.api_key_env names {serve_cfg.api_key_env}, which is not set: export "
            "it (the key clients send as X-API-Key), or unset search.serve.api_key_env"
        )
    return key


def make_api(cfg: Config):
    """The FastAPI app: validation, limits and error shapes (no index needed to build it)."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    limits = cfg.search.serve
    api = FastAPI(
        title="cpr-ray search",
        description="Papers from other fields whose ideas could solve a research problem.",
        version="1",
    )

    @api.middleware("http")
    async def body_limit(request: Request, call_next):
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
            return _too_large(limits.max_body_bytes)
        if request.method == "POST":
            body = await request.body()  # chunked uploads have no length to trust
            if len(body) > limits.max_body_bytes:
                return _too_large(limits.max_body_bytes)
        return await call_next(request)

    @api.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        detail = [
            {"loc": [str(p) for p in e.get("loc", ())], "msg": e.get("msg", "")}
            for e in exc.errors()
        ]
        message = "; ".join(f"{'.'.join(d['loc'][1:]) or 'body'}: {d['msg']}" for d in detail)
        return JSONResponse(
            {"error": f"invalid request: {message}", "detail": detail}, status_code=422
        )

    @api.exception_handler(UserError)
    async def user_error(request: Request, exc: UserError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=422)

    @api.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception) -> JSONResponse:
        log.exception("search request failed")
        return JSONResponse(
            {"error": "internal error: the service log has the details"}, status_code=500
        )

    return api


def _too_large(limit: int):
    from fastapi.responses import JSONResponse

    return JSONResponse(
        {"error": f"request body over {limit} bytes (search.serve.max_body_bytes)"},
        status_code=413,
    )


def build_app(cfg: Config):
    """The Serve application over the index at ``search.index``."""
    from fastapi import Header, HTTPException
    from ray import serve

    cfg.require("search.index")
    limits = cfg.search.serve
    api_key(limits)  # fail here, not in every replica
    api = make_api(cfg)
    config_json = cfg.model_dump_json()

    @serve.deployment(
        name="search",
        max_ongoing_requests=limits.max_ongoing_requests,
        max_queued_requests=limits.max_queued_requests,
        autoscaling_config={
            "min_replicas": limits.min_replicas,
            "max_replicas": limits.max_replicas,
            "target_ongoing_requests": limits.target_ongoing_requests,
        },
        ray_actor_options={"num_cpus": limits.cpus_per_replica},
        health_check_period_s=10,
    )
    @serve.ingress(api)
    class SearchService:
        def __init__(self, config: str) -> None:
            from cpr_ray.search.engine import SearchIndex
            from cpr_ray.storage import Storage

            self.cfg = Config.model_validate_json(config)
            self.key = api_key(self.cfg.search.serve)
            self.index = SearchIndex.load(
                Storage(self.cfg.storage),
                str(self.cfg.search.index),
                device=self.cfg.encoder.device,
            )
            self.index.encode(["warm-up"])  # the model loads before the first request

        def _check_key(self, given: str | None) -> None:
            if self.key is not None and not hmac.compare_digest(given or "", self.key):
                raise HTTPException(status_code=401, detail="missing or wrong X-API-Key")

        @api.get("/healthz")
        def healthz(self) -> dict[str, Any]:
            return {"status": "ok", "documents": len(self.index), "index": self.cfg.search.index}

        @api.post("/search")
        def search(
            self, request: SearchRequest, x_api_key: str | None = Header(None)
        ) -> dict[str, Any]:
            from cpr_ray.search.engine import Query
            from cpr_ray.search.run import run_search, search_options

            self._check_key(x_api_key)
            if request.query is not None:
                queries = [Query("q1", request.query)]
            else:
                queries = [
                    Query(q.query_id or f"q{i}", q.query)
                    for i, q in enumerate(request.queries or [], start=1)
                ]
            if len(queries) > self.cfg.search.serve.max_queries:
                raise HTTPException(
                    status_code=422,
                    detail=f"{len(queries)} queries, over search.serve.max_queries "
                    f"({self.cfg.search.serve.max_queries})",
                )
            opts = search_options(
                self.cfg,
                k=request.k,
                other_fields_only=request.other_fields_only,
                field=request.field,
                exclude_fields=tuple(request.exclude_fields),
                before=request.before,
                hybrid=request.hybrid,
            )
            results = run_search(
                self.index,
                queries,
                opts,
                self.cfg,
                rerank=request.rerank == "llm",
                explain=request.explain,
            )
            return {"results": results}

    return SearchService.bind(config_json)


def app_builder(args: dict[str, Any]):
    """For `serve run`/`serve deploy` (infra/serve/search.yaml): ``index`` (required),
    ``config`` (a YAML path or s3://…), ``profile`` and ``set`` (a list of KEY=VALUE)."""
    if "index" not in args:
        raise ConfigError("the search application needs args.index (the index URI)")
    cfg = load_config(
        args.get("profile"),
        args.get("config"),
        list(args.get("set", [])),
        flags={"search.index": args["index"]},
    )
    return build_app(cfg)


def run_locally(cfg: Config) -> None:
    """`cpr serve`: start Serve on a local (or the configured) Ray and serve until stopped."""
    from ray import serve

    from cpr_ray.command_line import console
    from cpr_ray.ray_runtime import ensure_ray

    limits = cfg.search.serve
    app = build_app(cfg)
    ensure_ray(cfg.ray)  # replicas' access logs stay in Ray's log files
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    quiet = {"log_level": "WARNING"}  # the controller's and proxy's INFO lines, on the console
    serve.start(http_options={"host": limits.host, "port": limits.port}, logging_config=quiet)
    serve.run(app, name="cpr-search", route_prefix="/")
    url = f"http://{limits.host}:{limits.port}"
    console.print(
        f"serving {cfg.search.index} at {url}: POST /search, GET /healthz, API docs at /docs "
        f"({limits.min_replicas}-{limits.max_replicas} replica(s), "
        f"{limits.max_ongoing_requests} ongoing + {limits.max_queued_requests} queued each); "
        "Ctrl-C stops",
        soft_wrap=True,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
        console.print("search service stopped")
