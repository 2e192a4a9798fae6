"""A scripted OpenAI-compatible chat endpoint on loopback, for tests and benchmarks.

It stands in for the external LLM service only (the client, actors and stages under test are
real). Answers are deterministic functions of the request, chosen by the requested schema's
name; markers in the prompt pick special behaviour (SAME → same problem, UNRELATED → not an
analogy, OFFGOAL → mappings made, then found off q's goal (not an analogy),
INCONSISTENT → a decision that always contradicts the rest of the answer, REJECT → reject
verdict,
BADQUERY → a rule-breaking query, BADFORM → a query the schema refuses until an objection is
given, USELESS → usefulness 1, PLAINSCORE → a non-JSON grader reply; the strongest-analogy judge
picks the candidate titled STRONGEST, else the first, and names no candidate for a citing paper
titled OUTOFRANGE).
The analogy judge *obeys* injected text: a prompt that says "ignore previous instructions"
anywhere gets a consistent, accepting judgment (observed analogy, valid mappings and relations)
whatever the pair, as a gullible production model would.
Faults are queued through `POST /_faults` and consumed by the next requests, in order:
{"kind": "429", "retry_after": 1}, {"kind": "500"}, {"kind": "timeout", "seconds": 5},
{"kind": "invalid_json"}, {"kind": "truncate"}, {"kind": "inconsistent"}.
`GET /_stats` counts requests per schema; `POST /_reset` clears faults and counts;
`POST /_latency {"ms": 200}` adds a fixed delay to every answer; `POST /_fault_rates
{"429": 0.01, "500": 0.01, "seed": 0}` makes that share of requests (drawn at random, seeded)
answer 429 (Retry-After 1) or 500 when no queued fault is due; `POST /_negatives {"score": 1}`
grades every passage judged without mappings (the N2 negatives grader) with that score, so a
negatives walk ends as it does with a real model (most candidates are not usable), not after
the whole pool. `POST /_prompts` answers every request's prompt in the order they came.
`POST /_pause` holds every request until `POST /_resume` (a node can be removed
while its requests wait); `answered` counts the answers sent to a client still connected,
`undelivered` those whose client had gone.

Run (from the repository root): python -m tests.standins.scripted_llm --port PORT
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import ssl
import time
from collections import Counter
from typing import Any

from aiohttp import web

from cpr_ray.queries.analogy import EXCLUSIONS
from tests.standins.controls import add_controls


def _title(prompt: str, label: str) -> str:
    m = re.search(rf"{label}: (.*)", prompt)
    return m.group(1).strip() if m else ""


INJECTION = re.compile(r"ignore (?:all |any |the )?(?:previous|prior|above) instructions", re.I)

NO_EXCLUSION = dict.fromkeys(EXCLUSIONS, False)  # the answer contract's checklist, all clear
ACCEPTING = {
    "same_problem": False,
    **NO_EXCLUSION,
    "object_mappings": [
        {"q_object": "data distribution", "d_object": "initial state", "role": "start"},
        {"q_object": "noise distribution", "d_object": "equilibrium state", "role": "end"},
    ],
    "shared_relations": [
        {
            "predicate": "Converts",
            "arguments": [1, 2],  # data distribution, noise distribution
        }
    ],
    "structural_analogy": True,
    "transfer_holds": True,
    "transferable": True,
    "transfer_type": "method",
    "transfer_path": {
        "from_d": "the diffusion process of d",
        "through_mappings": "data and noise map to the initial and equilibrium states",
        "helps_q": "q turns data into noise and back",
    },
    "reason": "the citing text uses the process",
    "decision": "observed_analogy",
}
REJECTING = {
    "same_problem": False,
    **NO_EXCLUSION,
    "surface_similarity": True,
    "object_mappings": [],
    "shared_relations": [],
    "structural_analogy": False,
    "transfer_holds": False,
    "transferable": False,
    "transfer_type": "none",
    "transfer_path": {"from_d": "", "through_mappings": "", "helps_q": ""},
    "reason": "no correspondence of relations",
    "decision": "not_analogy",
}


def analogy(prompt: str) -> dict[str, Any]:
    if INJECTION.search(prompt):
        return ACCEPTING  # obeys the injected text, whatever the pair
    title = _title(prompt, "Q title")
    if "SAME" in title:
        return REJECTING | {
            "same_problem": True,
            "surface_similarity": False,
            "transfer_type": "same_problem",
            "reason": "same task",
        }
    if "UNRELATED" in title:
        return REJECTING
    if "OFFGOAL" in title:
        return ACCEPTING | {
            "off_goal_mapping": True,
            "structural_analogy": False,
            "transfer_holds": False,
            "transferable": False,
            "reason": "the mapped process does not serve q's goal",
            "decision": "not_analogy",
        }
    if "INCONSISTENT" in title:
        return ACCEPTING | {"decision": "not_analogy"}
    return ACCEPTING


def transfer(prompt: str) -> dict[str, Any]:
    if "REJECT" in _title(prompt, "Q title"):
        return {"verdict": "reject", "reject_reason": "background_only", "reason": "background"}
    return {"verdict": "transfer", "reject_reason": None, "reason": "q builds on d"}


def problem(prompt: str) -> dict[str, Any]:
    title = _title(prompt, "Title")
    return {"problem": f"The difficulty of {title.lower()} under limited data."}


def query(prompt: str) -> dict[str, Any]:
    text = _title(prompt, "Problem")
    if "badquery" in text.lower():
        # fits the schema's pattern, breaks the mechanical rules
        return {"query": "How to apply the analogy of the cited paper by using noise?"}
    if "badform" in text.lower() and "Objection:" not in prompt:
        return {"query": "How to recover signals [3]."}  # the pattern refuses it
    words = re.findall(r"[a-z]+", text.lower())[3:12]
    return {"query": "How to " + " ".join(words) + "?"}


def review(prompt: str) -> dict[str, Any]:
    return {"problem_only": True, "grounded": True, "well_formed": True, "issue": None}


def same_problem(prompt: str) -> dict[str, Any]:
    a, b = _title(prompt, "Question A"), _title(prompt, "Question B")
    return {"same_problem": a.split()[:5] == b.split()[:5], "reason": "compared openings"}


def strongest(prompt: str) -> dict[str, Any]:
    titles = re.findall(r"^Cited title: (.*)$", prompt, re.M)
    if "OUTOFRANGE" in _title(prompt, "Citing paper's title"):
        return {"index": len(titles) + 1, "reason": "names no candidate"}
    marked = [i for i, t in enumerate(titles, 1) if "STRONGEST" in t]
    return {"index": marked[0] if marked else 1, "reason": "carries over its own method"}


def usefulness(prompt: str) -> dict[str, Any] | str:
    passage = _title(prompt, "Passage")
    if "PLAINSCORE" in passage:
        return "The passage offers a usable method after adaptation. Final score: 2"
    return {"score": 1 if "USELESS" in passage else 3}


def chosen(prompt: str) -> dict[str, Any]:
    k = int(re.search(r"pick the (\d+)\s+most", prompt).group(1))
    cands = re.findall(r"^\[([^\]]+)\] (.*)$", prompt, re.M)
    ordered = [d for d, t in cands if "useful" in t] + [d for d, t in cands if "useful" not in t]
    return {"review": "picked the useful ones", "ids": ordered[:k]}


def score(prompt: str) -> dict[str, Any]:
    return {"score": 9 if "useful" in _title(prompt, "Paper") else 2}


def hyde_passage(prompt: str) -> dict[str, Any]:
    return {"passage": f"We study {_title(prompt, 'Question').rstrip('?')} with a new method."}


def hyde_passages(prompt: str) -> dict[str, Any]:
    q = _title(prompt, "Question").rstrip("?")
    asked = re.search(r"Imagine (\d+) different papers", prompt)
    n = int(asked.group(1)) if asked else 1
    return {"passages": [f"We study {q} with method {i}." for i in range(n)]}


def fusion(prompt: str) -> dict[str, Any]:
    q = _title(prompt, "Question")
    return {"queries": [f"{q} variant {i}" for i in range(4)]}


def diverse_queries(prompt: str) -> dict[str, Any]:
    words = [w for w in re.findall(r"[a-z]+", _title(prompt, "Title").lower()) if len(w) > 1]
    topic = " ".join(words[:6] or ["papers", "here"])
    return {
        "factual": f"What does {topic} report?",
        "procedural": f"How to do {topic}?",
        "causal": f"Why does {topic} work?",
        "conditional": f"If {topic} fails, what then?",
        "keyword": " ".join((words + ["papers", "here"])[:4]),
        "comparison": f"How does {topic} compare with earlier methods?",
    }


def paraphrases(prompt: str) -> dict[str, Any]:
    q = _title(prompt, "Query").rstrip("?")
    asked = re.search(r"in (\d+) different ways", prompt)
    n = int(asked.group(1)) if asked else 3
    return {"paraphrases": [f"{q}, said way {i}?" for i in range(n)]}


ANSWERS = {
    "DiverseQueries": diverse_queries,
    "Paraphrases": paraphrases,
    "Chosen": chosen,
    "Score": score,
    "Passage": hyde_passage,
    "Passages": hyde_passages,
    "Queries": fusion,
    "AnalogyJudgment": analogy,
    "TransferVerdict": transfer,
    "ProblemStatement": problem,
    "WrittenQuery": query,
    "QueryReview": review,
    "SameProblem": same_problem,
    "StrongestAnalogy": strongest,
    "Usefulness": usefulness,
}


class Script:
    def __init__(self) -> None:
        self.faults: list[dict[str, Any]] = []
        self.counts: Counter[str] = Counter()
        self.latency_s = 0.0
        self.unmapped_score: int | None = None  # set: the grade of passages without mappings
        self.cached_tokens: int | None = None  # set: prompt tokens reported as cache hits
        self.arrivals: list[float] = []  # wall time of each chat request, for rate checks
        self.prompts: list[str] = []  # each chat request's prompt, in the order they came
        self.fault_rates: dict[str, float] = {}
        self.rng = random.Random(0)
        self.open = asyncio.Event()  # cleared by /_pause: requests wait for /_resume
        self.open.set()


def _reply(content: str, finish: str, prompt: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": 0,
        "model": "scripted",
        "choices": [
            {
                "index": 0,
                "finish_reason": finish,
                "message": {"role": "assistant", "content": content},
            }
        ],
        "usage": {
            "prompt_tokens": len(prompt) // 4,
            "completion_tokens": len(content) // 4,
            "total_tokens": (len(prompt) + len(content)) // 4,
        },
    }


async def chat(request: web.Request) -> web.Response:
    script: Script = request.app["script"]
    body = await request.json()
    fmt = body.get("response_format") or {}
    name = (fmt.get("json_schema") or {}).get("name", "unknown")
    prompt = body["messages"][0]["content"]
    script.counts[name] += 1
    script.counts["total"] += 1
    script.arrivals.append(time.time())
    script.prompts.append(prompt)
    if script.latency_s:
        await asyncio.sleep(script.latency_s)
    await script.open.wait()
    fault = _next_fault(script)
    if fault:
        kind = fault["kind"]
        script.counts[f"fault_{kind}"] += 1
        if kind == "429":
            return web.json_response(
                {"error": {"message": "rate limited"}},
                status=429,
                headers={"Retry-After": str(fault.get("retry_after", 1))},
            )
        if kind == "500":
            return web.json_response({"error": {"message": "boom"}}, status=500)
        if kind in ("401", "html"):
            return _refusal(kind)
        if kind == "prose":
            return web.json_response(_reply("These two papers seem related.", "stop", prompt))
        if kind == "hang":  # answer only after the client has given up (or been killed)
            await asyncio.sleep(fault.get("seconds", 600))
        if kind == "timeout":
            await asyncio.sleep(fault.get("seconds", 5))
        if kind == "invalid_json":
            return web.json_response(_reply('{"same_problem": tru', "stop", prompt))
        if kind == "truncate":
            return web.json_response(_reply('{"score": ', "length", prompt))
        if kind == "inconsistent" and name == "AnalogyJudgment":
            bad = analogy(prompt) | {"decision": "not_analogy"}
            return web.json_response(_reply(json.dumps(bad), "stop", prompt))
    answer = ANSWERS[name](prompt) if name in ANSWERS else {}
    unmapped = script.unmapped_score
    if name == "Usefulness" and unmapped is not None and "Mappings:" not in prompt:
        answer = {"score": unmapped}  # a negative's grader gets no mapping block
    content = answer if isinstance(answer, str) else json.dumps(answer)
    if request.transport is None or request.transport.is_closing():
        script.counts["undelivered"] += 1  # its client is gone (a lost node): nothing was paid
    else:
        script.counts["answered"] += 1
    reply = _reply(content, "stop", prompt)
    if script.cached_tokens is not None:
        usage = reply["usage"]
        usage["prompt_tokens_details"] = {
            "cached_tokens": min(script.cached_tokens, usage["prompt_tokens"])
        }
    return web.json_response(reply)


def _next_fault(script: Script) -> dict[str, Any] | None:
    """The next queued fault, one per request; a fault marked `always` stays for every request.

    Kind `pass` answers normally, so a queue can script exactly which requests misbehave."""
    if not script.faults:
        draw = script.rng.random()
        for kind, rate in script.fault_rates.items():
            if draw < rate:
                return {"kind": kind, "retry_after": 1}
            draw -= rate
        return None
    fault = script.faults[0] if script.faults[0].get("always") else script.faults.pop(0)
    return None if fault["kind"] == "pass" else fault


def _refusal(kind: str) -> web.Response:
    if kind == "401":
        return web.json_response({"error": {"message": "invalid api key"}}, status=401)
    page = "<html><body>Welcome to nginx!</body></html>"
    return web.Response(text=page, content_type="text/html")


async def models(request: web.Request) -> web.Response:
    script: Script = request.app["script"]
    script.counts["models"] += 1
    fault = script.faults[0] if script.faults and script.faults[0].get("always") else None
    if fault and fault["kind"] in ("401", "html"):
        return _refusal(fault["kind"])
    return web.json_response({"object": "list", "data": [{"id": "scripted", "object": "model"}]})


def app() -> web.Application:
    application = web.Application()
    application["script"] = Script()

    def script() -> Script:
        return application["script"]

    def queue_faults(body: list[dict[str, Any]]) -> dict[str, int]:
        script().faults.extend(body)
        return {"queued": len(script().faults)}

    def reset(body: None) -> None:
        script().open.set()  # requests held by a pause go on
        application["script"] = Script()

    def set_latency(body: dict[str, float]) -> None:
        script().latency_s = body["ms"] / 1000

    def set_fault_rates(body: dict[str, float]) -> None:
        script().rng = random.Random(body.pop("seed", 0))
        script().fault_rates = {kind: float(rate) for kind, rate in body.items()}

    def set_negatives(body: dict[str, int]) -> None:
        script().unmapped_score = body["score"]

    def set_prompt_cache(body: dict[str, int]) -> None:
        script().cached_tokens = body["tokens"]

    application.router.add_post("/v1/chat/completions", chat)
    application.router.add_get("/v1/models", models)
    application.router.add_get("/health", lambda r: web.json_response({"status": "ok"}))
    add_controls(
        application,
        {
            "faults": queue_faults,
            "reset": reset,
            "latency": set_latency,
            "fault_rates": set_fault_rates,
            "negatives": set_negatives,
            "prompt_cache": set_prompt_cache,
            "prompts": lambda body: script().prompts,
            "pause": lambda body: script().open.clear(),
            "resume": lambda body: script().open.set(),
        },
        lambda: {**script().counts, "arrivals": script().arrivals},
    )
    return application


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tls-cert", help="serve https with this certificate (PEM)")
    parser.add_argument("--tls-key", help="and its private key (PEM)")
    args = parser.parse_args()
    tls = None
    if args.tls_cert:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(args.tls_cert, args.tls_key)
    # hanging requests (fault `hang`) must not hold a test session's teardown
    web.run_app(
        app(),
        host="127.0.0.1",
        port=args.port,
        print=None,
        backlog=1024,
        shutdown_timeout=1,
        ssl_context=tls,
    )
