"""The search service: Ray Serve replicas over the same `run_search` as `cpr search`.

``POST /search`` takes ``{"query": "How to …"}`` (or ``"queries": [{"query_id", "query"}, …]``,
each query optionally with ``excluded_ids``: papers never returned for it) and the CLI's options
(``k``, ``other_fields_only``, ``field``, ``exclude_fields``, ``before``, ``retriever``:
hybrid, dense or bm25, unset the index's default; ``rerank``, ``explain``) and answers
``{"results": [...]}``, each result the JSON line `cpr search --json` prints; ``infer_field``
adds the query's inferred field where no filter needed it, ``abstracts`` each hit's abstract
(null: withheld by its licence). ``POST /explain`` takes ``{"query", "corpus_id",
"query_field"}`` and answers the LLM's explanation of that one hit (`llm_steps.explain_one`:
mappings, shared relations, transfer path), as ``explain`` would attach it. ``GET /healthz``
answers once the index is loaded, saying whether the service asks for a key (``api_key``: the
search page shows its key panel only then); ``/docs`` and ``/openapi.json`` describe the API.

``GET /`` is the search page (``cpr_ray/search/page/``: plain HTML, JS and CSS shipped in the
package, no build step and nothing fetched from elsewhere, so it works offline): a problem,
the filters and k, the hits with their abstracts, and a button per hit that asks ``/explain``.
The page itself is public; its calls carry the key the user enters once as ``X-API-Key``.

What a client sees when it asks too much: 422 with the fields at fault (a malformed body, too
many queries) or with the line `cpr search` prints for the same mistake (a blank query, k
outside 1 to ``search.max_k``: `Query` and `search_options` check both for both), 413 for a body
over ``search.serve.max_body_bytes``, 401 without the API key (when ``search.serve.api_key_env``
names one), 503 when every replica is busy and the bounded queue (``max_queued_requests``) is
full or the LLM endpoint behind ``rerank``/``explain`` cannot be reached or refuses the service's
key, and never a stack trace (500 says to read the service log); each as ``{"error": "…"}``,
one line a person can read (the search page shows it as it is). Replicas autoscale between
``min_replicas`` and ``max_replicas``.

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
from cpr_ray.errors import ConfigError, LLMConfigError, LLMStageError, UserError

log = logging.getLogger("cpr_ray.search.serve")
QUERY_CHARS = 4000


class QueryIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query_id: str | None = Field(None, max_length=200)
    query: str = Field(max_length=QUERY_CHARS)
    excluded_ids: list[int | str] = Field(
        default_factory=list,
        max_length=100,
        description="Papers never returned for this query (its own paper).",
    )


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: str | None = Field(None, max_length=QUERY_CHARS)
    queries: list[QueryIn] | None = Field(None, min_length=1)
    k: int | None = None
    other_fields_only: bool = False
    field: str | None = None
    exclude_fields: list[str] = Field(default_factory=list)
    before: int | None = None
    retriever: Literal["hybrid", "dense", "bm25"] | None = Field(
        None,
        description="The side(s) searched; unset: hybrid where the index has BM25, else dense.",
    )
    rerank: Literal["llm"] | None = None
    explain: bool = False
    infer_field: bool = Field(
        False,
        description="Say each query's field (inferred from its nearest papers) even where no "
        "filter needs it: one more scan of the index.",
    )
    abstracts: bool = Field(
        False, description="Give each hit its abstract (null where its licence withholds it)."
    )

    @model_validator(mode="after")
    def _one_form(self) -> "SearchRequest":
        if (self.query is None) == (self.queries is None):
            raise ValueError('give "query" or "queries", not both and not neither')
        return self


class ExplainRequest(BaseModel):
    """One hit to explain for one research problem (the search page's button)."""

    model_config = ConfigDict(extra="forbid")
    query: str = Field(max_length=QUERY_CHARS, description="The research problem.")
    corpus_id: int | str = Field(description="The hit's corpus id, as /search gave it.")
    query_field: str | None = Field(
        None,
        max_length=200,
        description="The query's field as /search gave it (the judge reads it as its topic).",
    )


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
    from starlette.exceptions import HTTPException as StarletteHTTPException

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

    @api.exception_handler(StarletteHTTPException)
    async def refused(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # 401, 404, 503 and the ingress's own 422s: the one error shape, not FastAPI's "detail"
        return JSONResponse({"error": str(exc.detail)}, exc.status_code, headers=exc.headers)

    @api.exception_handler(UserError)
    async def user_error(request: Request, exc: UserError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=422)

    @api.exception_handler(LLMConfigError)
    @api.exception_handler(LLMStageError)
    async def llm_unavailable(request: Request, exc: UserError) -> JSONResponse:
        # the service's LLM endpoint is down or refuses the service's key: nothing the client
        # sent is at fault (422 would say it was), and a retry may find it back
        return JSONResponse(
            {"error": f"the LLM endpoint is unavailable: {exc}"},
            status_code=503,
            headers={"Retry-After": "5"},
        )

    @api.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception) -> JSONResponse:
        log.exception("search request failed")
        return JSONResponse(
            {"error": "internal error: the service log has the details"}, status_code=500
        )

    add_page(api)
    return api


PAGE_FILES = {"index.html": "text/html", "app.js": "text/javascript", "style.css": "text/css"}
# the page loads nothing from anywhere else: a CDN slipped in would fail here, not only offline
PAGE_POLICY = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"


def add_page(api: Any) -> None:
    """The search page at ``/`` and its assets at ``/page/NAME``, read from the package once,
    here, so every replica serves the files it was built with."""
    from importlib.resources import files

    from fastapi import HTTPException
    from fastapi.responses import Response

    folder = files("cpr_ray.search") / "page"
    content = {name: (folder / name).read_bytes() for name in PAGE_FILES}
    headers = {"content-security-policy": PAGE_POLICY, "cache-control": "no-cache"}

    def page_file(name: str) -> Response:
        if name not in content:
            raise HTTPException(status_code=404, detail=f"no page file {name}")
        return Response(content[name], media_type=PAGE_FILES[name], headers=headers)

    @api.get("/", include_in_schema=False)
    async def page() -> Response:
        return page_file("index.html")

    @api.get("/page/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        return page_file(name)


def _too_large(limit: int):
    from fastapi.responses import JSONResponse

    return JSONResponse(
        {"error": f"request body over {limit} bytes (search.serve.max_body_bytes)"},
        status_code=413,
    )


# the resource Ray gives the head node only: the ingress lives there, off the spot workers
HEAD_NODE = "node:__internal_head__"
LOST_REPLICA_RETRIES = 1  # a request whose replica died is sent once more, then answered 503


def _queries(request: SearchRequest, max_queries: int) -> list[Any]:
    """The request's queries, checked as `cpr search` checks them (blank ones refused)."""
    from fastapi import HTTPException

    from cpr_ray.search.engine import Query

    if request.query is not None:
        queries = [Query("q1", request.query)]
    else:
        queries = [
            Query(q.query_id or f"q{i}", q.query, tuple(q.excluded_ids))
            for i, q in enumerate(request.queries or [], start=1)
        ]
    if len(queries) > max_queries:
        raise HTTPException(
            status_code=422,
            detail=f"{len(queries)} queries, over search.serve.max_queries ({max_queries})",
        )
    return queries


def _unavailable(detail: str):
    from fastapi import HTTPException

    return HTTPException(status_code=503, detail=detail, headers={"Retry-After": "1"})


def build_app(cfg: Config):
    """The Serve application over the index at ``search.index``: an ingress on the head node
    (HTTP, the key, validation) in front of the autoscaling search replicas.

    The split is for node loss. A request that Serve's proxy routes straight to a replica whose
    node dies in the middle answers 500; through the ingress, a request whose replica was lost
    is sent again to a live one (`LOST_REPLICA_RETRIES`), and answered 503 with Retry-After
    only when none is left, so a client never sees a 500 for a lost spot worker."""
    from fastapi import Header, HTTPException
    from ray import serve
    from ray.exceptions import ActorDiedError, ActorUnavailableError
    from ray.serve.exceptions import BackPressureError

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
    class SearchReplica:
        def __init__(self, config: str) -> None:
            from cpr_ray.retrieval.spec import EncoderSpec
            from cpr_ray.search.engine import SearchIndex
            from cpr_ray.storage.store import Storage

            self.cfg = Config.model_validate_json(config)
            self.index = SearchIndex.load(
                Storage(self.cfg.storage),
                str(self.cfg.search.index),
                EncoderSpec.from_config(self.cfg.encoder),
            )
            self.index.encode(["warm-up"])  # the model loads before the first request
            if self.index.notice:
                log.warning("%s: %s", self.cfg.search.index, self.index.notice)

        def documents(self) -> int:
            return len(self.index)

        def search(
            self, queries: list[Any], opts: Any, rerank: bool, explain: bool, extras: dict
        ) -> list[dict[str, Any]]:
            from cpr_ray.search.run import run_search

            return run_search(
                self.index, queries, opts, self.cfg, rerank=rerank, explain=explain, **extras
            )

        def explain_one(
            self, query: Any, corpus_id: Any, query_field: str | None
        ) -> dict[str, Any]:
            from cpr_ray.search.llm_steps import explain_one

            return explain_one(self.index, query, corpus_id, self.cfg, query_field)

    @serve.deployment(
        name="ingress",
        # small and stateless: enough ongoing requests to hold every replica's, and their queues
        max_ongoing_requests=max(
            100, limits.max_replicas * (limits.max_ongoing_requests + limits.max_queued_requests)
        ),
        ray_actor_options={"num_cpus": 0, "resources": {HEAD_NODE: 0.001}},
    )
    @serve.ingress(api)
    class SearchIngress:
        def __init__(self, replicas: Any, config: str) -> None:
            self.replicas = replicas
            self.cfg = Config.model_validate_json(config)
            self.key = api_key(self.cfg.search.serve)

        def _check_key(self, given: str | None) -> None:
            if self.key is not None and not hmac.compare_digest(given or "", self.key):
                raise HTTPException(status_code=401, detail="missing or wrong X-API-Key")

        async def _call(self, method: str, *args: Any) -> Any:
            """One call to a replica: a lost replica's request once more, then 503; a full
            queue at once 503; a user's mistake found by the replica its 422."""
            from cpr_ray.runs.ray_runtime import user_error_in

            for attempt in range(LOST_REPLICA_RETRIES + 1):
                try:
                    return await getattr(self.replicas, method).remote(*args)
                except BackPressureError:
                    raise _unavailable("every search replica is busy: retry shortly") from None
                except (ActorDiedError, ActorUnavailableError):
                    log.warning("a search replica was lost mid-request (attempt %d)", attempt + 1)
                except UserError as exc:  # raised in the replica: its line, not Ray's wrapper
                    raise (user_error_in(exc) or exc) from None
            raise _unavailable("a search replica was lost: retry shortly")

        @api.get("/healthz")
        async def healthz(self) -> dict[str, Any]:
            documents = await self._call("documents")
            return {
                "status": "ok",
                "documents": documents,
                "index": self.cfg.search.index,
                "api_key": self.key is not None,
            }

        @api.post("/search")
        async def search(
            self, request: SearchRequest, x_api_key: str | None = Header(None)
        ) -> dict[str, Any]:
            from cpr_ray.search.run import search_options

            self._check_key(x_api_key)
            queries = _queries(request, self.cfg.search.serve.max_queries)
            opts = search_options(
                self.cfg,
                k=request.k,
                other_fields_only=request.other_fields_only,
                field=request.field,
                exclude_fields=tuple(request.exclude_fields),
                before=request.before,
                retriever=request.retriever,
            )
            extras = {"infer_field": request.infer_field, "abstracts": request.abstracts}
            results = await self._call(
                "search", queries, opts, request.rerank == "llm", request.explain, extras
            )
            return {"results": results}

        @api.post("/explain")
        async def explain(
            self, request: ExplainRequest, x_api_key: str | None = Header(None)
        ) -> dict[str, Any]:
            """The LLM's explanation of one hit for one query: ``explanation`` (object
            mappings, shared relations, transfer type and path, decision, reason; null where
            the LLM gave no valid answer) and the answer's ``status``."""
            from cpr_ray.search.engine import Query

            self._check_key(x_api_key)
            query = Query("q1", request.query)  # a blank one: 422, as /search says it
            return await self._call("explain_one", query, request.corpus_id, request.query_field)

    # mypy does not apply class decorators: serve.deployment made both classes Deployments
    replica = SearchReplica.bind(config_json)  # type: ignore[attr-defined]
    return SearchIngress.bind(replica, config_json)  # type: ignore[attr-defined]


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

    from cpr_ray.runs.command_options import console
    from cpr_ray.runs.ray_runtime import ensure_ray

    limits = cfg.search.serve
    app = build_app(cfg)
    ensure_ray(cfg.ray)  # replicas' access logs stay in Ray's log files
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    quiet = {"log_level": "WARNING"}  # the controller's and proxy's INFO lines, on the console
    # one proxy, on the head: the URL printed is the service's whatever node its replicas are
    # on, and losing a worker node (a spot instance) never takes the entry point with it
    http = {"host": limits.host, "port": limits.port, "location": "HeadOnly"}
    serve.start(http_options=http, logging_config=quiet)
    serve.run(app, name="cpr-search", route_prefix="/")
    url = f"http://{limits.host}:{limits.port}"
    console.print(
        f"serving {cfg.search.index} at {url}: the search page at /, POST /search, "
        "POST /explain, GET /healthz, API docs at /docs "
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
