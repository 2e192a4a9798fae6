"""The scripted endpoint (tests/standins/scripted_llm.py) with one more script: answers set per
prompt.

`POST /_gold [{"schema": NAME, "markers": [...], "answer": {...}}, ...]` makes every chat request
whose requested schema is NAME and whose prompt holds all the markers get that answer (the first
entry that matches); any other request is answered by scripted_llm's rules. `judge-check`'s tests
use it as a judge that answers each gold case's expected label, or any label a test scripts per
case (a judge with a known confusion matrix). `gold_answers` builds those entries from gold
cases, shaped by the answer models as they are now (so a field added to a contract is filled
from the model, not from a copy here).

Run (from the repository root): python -m tests.standins.gold_llm --port PORT
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

from tests.standins import scripted_llm


@web.middleware
async def gold_first(request: web.Request, handler: Any) -> web.StreamResponse:
    if request.path == "/v1/chat/completions" and request.app["gold"]:
        body = await request.json()  # aiohttp keeps the body: the scripted handler reads it again
        name = ((body.get("response_format") or {}).get("json_schema") or {}).get("name")
        prompt = body["messages"][0]["content"]
        for entry in request.app["gold"]:
            if entry["schema"] == name and all(m in prompt for m in entry["markers"]):
                content = json.dumps(entry["answer"])
                return web.json_response(scripted_llm._reply(content, "stop", prompt))
    return await handler(request)


async def set_gold(request: web.Request) -> web.Response:
    request.app["gold"] = await request.json()
    return web.json_response({"entries": len(request.app["gold"])})


def app() -> web.Application:
    application = scripted_llm.app()
    application.middlewares.append(gold_first)
    application["gold"] = []
    application.router.add_post("/_gold", set_gold)
    return application


# -- answers that reach each gold label (built in the test process) --------------------------------


def analogy_answer(decision: str, exclusion: str | None) -> dict[str, Any]:
    """The scripted judge's accepting answer with the gold's decision, or its rejecting one with
    the gold's exclusion as the only flag set."""
    if decision != "not_analogy":
        observed = decision == "observed_analogy"
        return scripted_llm.ACCEPTING | {"transfer_holds": observed, "decision": decision}
    flags = dict.fromkeys(scripted_llm.NO_EXCLUSION, False)
    if exclusion in flags:
        flags[exclusion] = True
    kinds = {
        "same_problem": "same_problem",
        "tool_or_data_as_is": "tool_as_is",
        "background_only": "narrative_only",
    }
    return (
        scripted_llm.REJECTING
        | flags
        | {
            "same_problem": exclusion == "same_problem",
            "transfer_type": kinds.get(exclusion, "none"),
            "reason": f"not an analogy ({exclusion})",
        }
    )


def transfer_answer(label: str) -> dict[str, Any]:
    if label == "transfer":
        return {"verdict": "transfer", "reject_reason": None, "reason": "q builds on d"}
    return {"verdict": "reject", "reject_reason": label, "reason": f"rejected: {label}"}


def usefulness_answer(score: int) -> dict[str, Any]:
    return {"score": score}


def review_answer(label: str, fails: list[str] | None) -> dict[str, Any]:
    """The reviewer's booleans: all true to accept; to reject, false for `fails` (the gold's,
    or well_formed when none is given)."""
    failed = set(fails or ["well_formed"]) if label == "reject" else set()
    names = ("problem_only", "grounded", "well_formed")
    issue = None if not failed else f"fails {', '.join(sorted(failed))}"
    return {n: n not in failed for n in names} | {"issue": issue}


def gold_answers(
    cases: list[Any], label_of: Callable[[Any], Any] | None = None
) -> list[dict[str, Any]]:
    """One `/_gold` entry per gold case: the answer that reaches `label_of(case)` (by default
    the case's expected label, a perfect judge), matched by texts only that case's prompt
    holds. For write-queries, `label_of` may return (label, fails)."""
    label_of = label_of or (lambda c: c.label)
    entries = []
    for case in cases:
        row, label = case.input, label_of(case)
        if case.stage == "judge-analogy":
            schema, markers = "AnalogyJudgment", [row["q_title"], row["d_title"]]
            answer = analogy_answer(label, case.exclusion)
        elif case.stage == "judge-transfer":
            schema, markers = "TransferVerdict", [row["q_title"], row["d_title"]]
            answer = transfer_answer(label)
        elif case.stage == "write-queries":
            label, fails = label if isinstance(label, tuple) else (label, case.fails)
            schema, markers = "QueryReview", [row["q_title"], row["query"]]
            answer = review_answer(label, list(fails or []))
        elif case.stage == "dedup":
            schema, markers = "SameProblem", [row["query_a"], row["query_b"]]
            answer = {"same_problem": label == "same", "reason": "compared"}
        elif case.stage == "strongest":
            schema, markers = "StrongestAnalogy", [row["q_title"]]
            answer = {"index": label, "reason": "carries most of its own method"}
        else:
            schema, markers = "Usefulness", [row["query"], row["passage"][:120]]
            answer = usefulness_answer(label)
        entries.append({"schema": schema, "markers": markers, "answer": answer})
    return entries


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    web.run_app(app(), host="127.0.0.1", port=args.port, print=None, shutdown_timeout=1)
