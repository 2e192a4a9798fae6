"""One search request, from its queries to its results: what `cpr search` and the service share."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from cpr_ray.config import Config
from cpr_ray.errors import InputError
from cpr_ray.retrieval.fusion import Fusion
from cpr_ray.search.engine import Query, SearchIndex, SearchOptions
from cpr_ray.sections import derive


def read_queries(text: str, source: str) -> list[Query]:
    """Plain lines (ids q1, q2, … by line), or JSON lines with `query_id`, `query` and
    optionally `excluded_ids` (papers never returned for it: a CPR-eval query's own paper)."""
    out: list[Query] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{source}: line {n} is not valid JSON ({exc.msg})") from None
            if not isinstance(row.get("query"), str) or not row["query"].strip():
                raise InputError(f'{source}: line {n} has no "query" text')
            excluded = row.get("excluded_ids") or []
            if not isinstance(excluded, list) or not all(
                isinstance(d, (int, str)) and not isinstance(d, bool) for d in excluded
            ):
                raise InputError(f'{source}: line {n}: "excluded_ids" must be a list of ids')
            query_id = str(row.get("query_id", f"q{n}"))
            out.append(Query(query_id, row["query"].strip(), tuple(excluded)))
        else:
            out.append(Query(f"q{n}", line.strip()))
    if not out:
        raise InputError(f"{source}: no query in it")
    ids = [q.query_id for q in out]
    if len(set(ids)) != len(ids):
        raise InputError(f"{source}: query ids are not unique")
    return out


def run_search(
    index: SearchIndex,
    queries: list[Query],
    opts: SearchOptions,
    cfg: Config,
    *,
    rerank: bool = False,
    explain: bool = False,
    infer_field: bool = False,
    abstracts: bool = False,
) -> list[dict[str, Any]]:
    """Search, then (optionally) rerank the top ``search.rerank_depth`` by the LLM tournament
    and explain each of the k hits left.

    ``infer_field``: say each query's field (``query_field``, inferred from its nearest papers)
    even where no filter needs it, at the cost of one more nearest-``infer_field_k`` scan;
    ``abstracts``: give each hit its ``abstract`` (None where the corpus has none: withheld by
    its licence)."""
    from cpr_ray.search import llm_steps

    depth = max(opts.k, cfg.search.rerank_depth) if rerank else opts.k
    vectors = None
    if infer_field and not (opts.other_fields_only or opts.field):
        vectors = index.encode([q.query for q in queries])  # encoded once for both scans
    results = index.search(queries, replace(opts, k=depth), vectors)
    if vectors is not None and index.manifest.get("has_fields", True):
        for result, own in zip(results, index.infer_fields(vectors, opts.infer_field_k)):
            result["query_field"], result["query_field_source"] = own, "inferred"
    if rerank:
        llm_steps.rerank(results, index, cfg, opts.k)
    if explain:
        llm_steps.explain(results, index, cfg)
    if abstracts:
        for hit in (h for r in results for h in r["hits"]):
            hit["abstract"] = index.abstract_of(hit["corpus_id"])
    return results


def search_options(cfg: Config, **given: Any) -> SearchOptions:
    """Options from a request or the command line, with the config's defaults and limits: the
    one check of k for `cpr search` and the service alike (not given: ``search.k``)."""
    k = given.pop("k", None)
    k = cfg.search.k if k is None else k
    if not 1 <= k <= cfg.search.max_k:
        raise InputError(f"k {k}: hits per query go from 1 to search.max_k ({cfg.search.max_k})")
    return derive(
        SearchOptions,
        cfg.search,
        k=k,
        fusion=Fusion.from_config(cfg.fusion),
        **{key: v for key, v in given.items() if v is not None},
    )
