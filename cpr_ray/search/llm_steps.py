"""The LLM's part in search: the evaluation suite's tournament reranker, and explanations.

Both go through the LLM layer (`run_llm_task`: cache, ledger, retries, schema-constrained
answers) under ``eval.llm_root``, so asking again about the same hits pays nothing and `cpr stats`
on that root shows what search spent.

An explanation is the analogy judgment of the build (B.1) asked of the query and one hit: the
query stands where the citing paper's title is, the hit where the cited paper is, with no citing
sentence. What comes back (object mappings, shared relations, transfer type and path, decision)
is what makes the hit transferable, or says that it is not. `explain_one` asks it of one hit
(the search page's button), through the same rows, so a hit explained on the page and by
``explain`` is one cache entry.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from cpr_ray.config import Config
from cpr_ray.errors import InputError
from cpr_ray.queries.judges import AnalogyJudge
from cpr_ray.retrieval.rerank import llm_reranker
from cpr_ray.search.engine import Query, SearchIndex

EXPLAINED = (
    "decision",
    "transfer_type",
    "transfer_path",
    "object_mappings",
    "shared_relations",
    "reason",
)


class ExplainHit(AnalogyJudge):
    """B.1 over (query, hit): its own stage, so its cache and ledger lines are search's."""

    stage = "search-explain"

    def __init__(self) -> None:
        super().__init__(hold_out_flagged=True)


def _key(corpus_id: Any) -> str:
    return json.dumps(corpus_id)  # 123 and "123" stay apart (S2 ids vs BEIR ids)


def rerank(results: list[dict[str, Any]], index: SearchIndex, cfg: Config, k: int) -> None:
    """Reorder each result's hits by the tournament, in place, and keep the best k."""
    texts = {
        _key(h["corpus_id"]): index.text_of(h["corpus_id"]) for r in results for h in r["hits"]
    }
    reranker = llm_reranker(cfg, texts)
    candidates = [[_key(h["corpus_id"]) for h in r["hits"]] for r in results]
    orders = reranker.rerank([r["query"] for r in results], candidates)
    for result, order in zip(results, orders):
        by_key = {_key(h["corpus_id"]): h for h in result["hits"]}
        result["hits"] = [{**by_key[key], "rank": n} for n, key in enumerate(order[:k], start=1)]
        result["reranked"] = "llm-tournament"


def explain(results: Sequence[dict[str, Any]], index: SearchIndex, cfg: Config) -> dict[str, int]:
    """Attach `explanation` to every hit (None where the LLM gave no valid answer); returns how
    many answers were ok, invalid or failed."""
    from cpr_ray.llm.step_runner import endpoint_url, run_llm_task
    from cpr_ray.retrieval.llm_judge import EVAL_STEPS, eval_context
    from cpr_ray.runs.ray_runtime import ensure_ray

    base_url = endpoint_url(cfg.llm, EVAL_STEPS)
    rows, where = [], []
    for r in results:
        for h in r["hits"]:
            rows.append(
                {
                    "base_id": str(r["query_id"]),
                    "cited_id": _key(h["corpus_id"]),
                    "q_title": r["query"],
                    "q_abstract": "",
                    "q_topic": r.get("query_field") or "",
                    "d_title": h["title"] or "",
                    "d_abstract": index.abstract_of(h["corpus_id"]) or "",
                    "d_topic": h.get("field") or "",
                    "contexts": None,
                }
            )
            where.append(h)
    counts = {"ok": 0, "invalid": 0, "failed": 0}
    if not rows:
        return counts
    ensure_ray(cfg.ray)
    table = pa.Table.from_pylist(rows, schema=_INPUT)
    out = run_llm_task(eval_context(cfg), ExplainHit(), table, base_url=base_url)
    for hit, answer in zip(where, out.table.to_pylist(), strict=True):
        counts[answer["status"]] = counts.get(answer["status"], 0) + 1
        hit["explanation"] = {k: answer[k] for k in EXPLAINED} if answer["status"] == "ok" else None
    return counts


def explain_one(
    index: SearchIndex, query: Query, corpus_id: Any, cfg: Config, query_field: str | None = None
) -> dict[str, Any]:
    """`explain` of one document for one query: ``explanation`` (None where the LLM gave no
    valid answer) and the answer's ``status``. ``query_field`` is the field the search said
    for the query, which the judge reads as the query's topic."""
    try:
        row = index.row_of(corpus_id)
    except KeyError:
        raise InputError(f"corpus id {corpus_id!r} is not in this index") from None
    hit = index.hit(row, 0.0, 1)
    result = {
        "query_id": query.query_id,
        "query": query.query,
        "query_field": query_field,
        "hits": [hit],
    }
    counts = explain([result], index, cfg)
    return {
        "query_id": query.query_id,
        "corpus_id": hit["corpus_id"],
        "title": hit["title"],
        "status": next(status for status, n in counts.items() if n),
        "explanation": hit["explanation"],
    }


_INPUT = pa.schema(
    [
        ("base_id", pa.string()),
        ("cited_id", pa.string()),
        ("q_title", pa.string()),
        ("q_abstract", pa.string()),
        ("q_topic", pa.string()),
        ("d_title", pa.string()),
        ("d_abstract", pa.string()),
        ("d_topic", pa.string()),
        ("contexts", pa.list_(pa.string())),
    ]
)
