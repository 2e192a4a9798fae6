"""`cpr index`, `cpr search` and `cpr serve` (registered on the main app in
cpr_ray/cpr_command.py)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from cpr_ray.errors import InputError, UserError
from cpr_ray.queries.judges import format_transfer_path
from cpr_ray.retrieval.spec import EncoderSpec
from cpr_ray.runs.command_options import (
    Flag,
    Given,
    console,
    fail,
    with_flags,
)
from cpr_ray.storage.store import Storage

# what `cpr search` and `cpr serve` set alike (the index is their argument)
READER_FLAGS = (
    Flag(
        "llm.base_url",
        name="llm_base_url",
        help="OpenAI-compatible endpoint for the LLM steps (key from $OPENAI_API_KEY, or the "
        "variable named by llm.api_key_env).",
    ),
    Flag("llm.model", name="llm_model", help="Model name at the endpoint."),
    Flag("storage.s3_endpoint", help="S3-compatible endpoint."),
)
SERVE_FLAGS = (
    *READER_FLAGS,
    Flag("search.serve.host", name="host", help="Listen address."),
    Flag("search.serve.port", name="port", help="Listen port."),
)


# `cpr index`'s and jobs/index.py's own flags (they win over --set, env and YAML)
INDEX_FLAGS = (
    Flag("search.corpus"),
    Flag("encoder.model", help="Dense model: a local folder or a hub name"),
    Flag("search.out"),
    Flag("search.bm25", help="Build the BM25 side (the default); --no-bm25: dense only."),
    Flag("storage.s3_endpoint"),
)


@with_flags(INDEX_FLAGS)
def index_command(given: Given) -> None:
    """Encode a corpus on Ray's encoder actor pools into a sharded faiss index with metadata;
    into an existing index, encode only new or changed papers and drop deleted ones."""
    from cpr_ray.search.sharded_index import build_index, summary_lines

    try:
        cfg = given.load()
        manifest = build_index(cfg)
    except UserError as exc:
        fail(exc)
    for line in summary_lines(manifest, str(cfg.search.out)):
        console.print(line, soft_wrap=True)


@contextmanager
def _logs_to_stderr() -> Iterator[None]:
    """With --json, standard output carries the JSON lines only: progress and logs go to stderr.
    (The console's stream is switched, not replaced: a replaced one would outlive a call made in
    the same process, a test runner's, and the next print would write to it once closed.)"""
    before = console.stderr
    console.stderr = True
    try:
        yield
    finally:
        console.stderr = before


def print_result(result: dict[str, Any]) -> None:
    title = f"[bold]{result['query_id']}[/]: {result['query']}"
    if result.get("query_field"):
        title += f"  (field: {result['query_field']}, {result['query_field_source']})"
    if result.get("fusion"):
        title += f"  [dim](hybrid {_fusion_text(result['fusion'])})[/]"
    table = Table(title=title, title_justify="left", show_lines=False)
    columns = ("#", "score", "dense", "bm25", "corpus id", "year", "field", "title")
    for col in columns:
        table.add_column(col, justify="left" if col in ("corpus id", "field", "title") else "right")
    for h in result["hits"]:
        table.add_row(
            str(h["rank"]),
            f"{h['score']:.4f}",
            _rank_text(h.get("dense_rank")),
            _rank_text(h.get("bm25_rank")),
            str(h["corpus_id"]),
            "" if h["year"] is None else str(h["year"]),
            h["field"] or "",
            h["title"] or "",
        )
        exp = h.get("explanation")
        if "explanation" in h:
            table.add_row("", "", "", "", "", "", "", _explanation_text(exp))
    console.print(table)
    if not result["hits"]:
        console.print("  no paper passes the filters")


def _rank_text(rank: int | None) -> str:
    """A hit's rank on one side; "–" where it was not in that side's fused depth."""
    return "–" if rank is None else str(rank)


def _fusion_text(fusion: dict[str, Any]) -> str:
    knob = f"k={fusion['k']}" if fusion["method"] == "rrf" else f"weight={fusion['weight']}"
    return f"{fusion['method']} {knob}, depth {fusion['depth']}"


def _explanation_text(exp: dict[str, Any] | None) -> str:
    if exp is None:
        return "[dim]no explanation (the LLM gave no valid answer; see the ledger)[/]"
    maps = "; ".join(f"{m['q_object']} ↔ {m['d_object']}" for m in exp["object_mappings"] or [])
    rels = "; ".join(r["predicate"] for r in exp["shared_relations"] or [])
    return (
        f"[italic]{exp['decision']} ({exp['transfer_type']})[/]: "
        f"{format_transfer_path(exp['transfer_path'])}"
        + (f"\nmappings: {maps}" if maps else "")
        + (f"\nshared relations: {rels}" if rels else "")
    )


def jsonl(results: list[dict[str, Any]]) -> str:
    """The `--json` form: one line per query."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in results)


@with_flags(READER_FLAGS)
def search_command(
    given: Given,
    index: Annotated[str, typer.Argument(help="Index folder from cpr index (path or s3://…).")],
    query: Annotated[
        str | None, typer.Argument(help='A research problem, e.g. "How to …".')
    ] = None,
    k: Annotated[int | None, typer.Option("-k", "--k", help="Hits per query.")] = None,
    other_fields_only: Annotated[
        bool, typer.Option("--other-fields-only", help="Drop hits from the query's own field.")
    ] = False,
    exclude_field: Annotated[
        list[str] | None, typer.Option("--exclude-field", help="Drop hits from this field.")
    ] = None,
    field: Annotated[
        str | None, typer.Option("--field", help="The query's own field (else inferred).")
    ] = None,
    before: Annotated[
        int | None, typer.Option("--before", help="Only papers published before this year.")
    ] = None,
    dense_only: Annotated[
        bool, typer.Option("--dense-only", help="Search the dense side only (no fusion).")
    ] = False,
    bm25_only: Annotated[
        bool, typer.Option("--bm25-only", help="Search the BM25 side only (no fusion).")
    ] = False,
    rerank: Annotated[
        str | None, typer.Option("--rerank", help="llm: the tournament reranker.")
    ] = None,
    explain: Annotated[
        bool, typer.Option("--explain", help="Ask the LLM why each hit transfers.")
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="JSON lines, one per query.")] = False,
    queries: Annotated[
        str | None,
        typer.Option(
            "--queries",
            help="File of queries: plain lines, or JSONL query_id/query (excluded_ids: papers "
            "never returned for that query).",
        ),
    ] = None,
    out: Annotated[str | None, typer.Option("--out", help="Write the JSON lines here.")] = None,
) -> None:
    """Papers from other fields whose ideas could solve a research problem: dense and BM25
    fused (the `fusion:` section) where the index has both sides, else dense."""
    from cpr_ray.search.engine import NO_BM25, Query, SearchIndex
    from cpr_ray.search.run import read_queries, run_search, search_options

    redirect = _logs_to_stderr() if json_out and out is None else _nothing()
    with redirect:
        try:
            if rerank not in (None, "llm"):
                raise InputError(f"--rerank {rerank!r}: the only reranker is llm")
            if dense_only and bm25_only:
                raise InputError("--dense-only and --bm25-only: choose one side, or neither")
            if (query is None) == (queries is None):
                raise InputError("give one query, or --queries FILE")
            cfg = given.load(extra={"search.index": index})
            storage = Storage(cfg.storage)
            if query is not None:
                asked = [Query("q1", query)]
            else:
                assert queries is not None  # one of the two, as checked above
                asked = read_queries(storage.read_text(queries), queries)
            opts = search_options(
                cfg,
                k=k,
                other_fields_only=other_fields_only,
                field=field,
                exclude_fields=tuple(exclude_field or ()),
                before=before,
                retriever="dense" if dense_only else "bm25" if bm25_only else None,
            )
            quiet_model_loading()
            reader = EncoderSpec.from_config(cfg.encoder)
            idx = SearchIndex.load(storage, str(cfg.search.index), reader)
            if idx.notice and not (dense_only or bm25_only):
                Console(stderr=True).print(f"[yellow]{NO_BM25}[/]", soft_wrap=True)
            results = run_search(idx, asked, opts, cfg, rerank=rerank == "llm", explain=explain)
        except UserError as exc:
            fail(exc)
    if out is not None:
        try:
            with storage.atomic_output(out) as f:
                f.write(jsonl(results).encode())
        except UserError as exc:
            fail(exc)
        console.print(f"{len(results)} result line(s) → {out}", soft_wrap=True)
    if json_out and out is None:
        sys.stdout.write(jsonl(results))
        sys.stdout.flush()
    elif not json_out:
        for r in results:
            print_result(r)


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def quiet_model_loading() -> None:
    """Turn off transformers' "Loading weights" bar (and the hub's download bars) in this
    process, which loads the query encoder itself: the bar, on stderr at every search, adds
    nothing to the command's own output. Ray workers get the same from `QUIET_ENV`."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


@with_flags(SERVE_FLAGS)
def serve_command(
    given: Given,
    index: Annotated[str, typer.Argument(help="Index folder from cpr index (path or s3://…).")],
) -> None:
    """Run the search service (Ray Serve): the search page at /, POST /search, POST /explain,
    GET /healthz, OpenAPI at /docs."""
    from cpr_ray.search.engine import NO_BM25, query_encoder_spec
    from cpr_ray.search.serve import run_locally
    from cpr_ray.search.sharded_index import require_index

    try:
        cfg = given.load(extra={"search.index": index})
        # here, not in the replicas: a wrong path, or an index whose model has gone, is one
        # line, not a failed deployment
        manifest = require_index(Storage(cfg.storage), str(cfg.search.index))
        query_encoder_spec(manifest, index, EncoderSpec.from_config(cfg.encoder))
        if not manifest.get("bm25"):
            Console(stderr=True).print(f"[yellow]{NO_BM25}[/]", soft_wrap=True)
        run_locally(cfg)
    except UserError as exc:
        fail(exc)
