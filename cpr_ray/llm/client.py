"""One asynchronous client for any OpenAI-compatible endpoint, with structured answers.

Every request asks for a JSON answer matching a pydantic model; replies are parsed leniently
(code fences, stray text, control characters) and validated strictly, then checked against the
step's own rules. A truncated, invalid or inconsistent answer is re-asked with the objection a
bounded number of times, then recorded as `invalid`. Transport trouble (429, 408, 5xx, timeouts,
dropped connections) is retried with capped exponential back-off and jitter, honouring
Retry-After; when retries run out the row is recorded as `failed`, never raised into the batch.
Errors no retry can fix (bad key, unknown model, bad request) stop the stage with one message.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import json
import os
import random
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from cpr_ray.config import LLMConfig
from cpr_ray.errors import LLMConfigError
from cpr_ray.llm.answers import constrained_schema
from cpr_ray.llm.http import (
    ChatEndpoint,
    ChatReply,
    EndpointStatusError,
    EndpointUnreachable,
    NotChatCompletion,
)
from cpr_ray.llm.reserve import RowBudget
from cpr_ray.llm.spend import call_usd, worst_usd

M = TypeVar("M", bound=BaseModel)
Status = Literal["ok", "invalid", "failed"]
RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
MAX_RETRY_AFTER_S = 300.0


class LLMRequestError(RuntimeError):
    """One request could not be completed after its retries."""


class RateLimiter(Protocol):
    async def acquire(self, tokens: int) -> None: ...


@dataclass
class Usage:
    """What a row cost: HTTP calls (retries included), re-asks, tokens."""

    calls: int = 0
    retries: int = 0
    reasks: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0  # of prompt_tokens, as the endpoint reports its prompt cache
    backoffs: list[float] = field(default_factory=list)
    # where the row reserves each request's worst case before sending it (a capped stage's)
    budget: RowBudget | None = None


@dataclass(frozen=True)
class Outcome(Generic[M]):
    value: M | None
    status: Status
    error: str | None
    raw: str | None


# tokens a chat template may add per message (role markers, separators) beyond its text
TEMPLATE_TOKENS = 16


def prompt_token_bound(messages: list[dict[str, str]], form: dict[str, Any]) -> int:
    """More prompt tokens than the request can be billed for, counted without a tokenizer: a
    byte-level BPE token (every tokenizer OpenAI-compatible servers use) spans at least one
    byte, so the UTF-8 bytes of the messages and of the answer schema, plus each message's
    template tokens, bound it."""
    text = sum(len(m["content"].encode()) for m in messages)
    schema = len(json.dumps(form, ensure_ascii=False).encode())
    return text + schema + TEMPLATE_TOKENS * (len(messages) + 1)


def parse_answer(text: str, answer: type[M]) -> tuple[M | None, str | None]:
    """Lenient parse, strict validation: (value, None) or (None, what is wrong)."""
    body = text.strip()
    fenced = re.search(r"```(?:json)?\s*(.*?)```", body, re.S)
    if fenced:
        body = fenced.group(1).strip()
    start, end = body.find("{"), body.rfind("}")
    if start < 0 or end <= start:
        return None, "the answer holds no JSON object"
    try:
        data = json.loads(body[start : end + 1], strict=False)  # raw control chars allowed
    except json.JSONDecodeError as exc:
        return None, f"the answer is not valid JSON ({exc.msg} at char {exc.pos})"
    try:
        return answer.model_validate(data), None
    except ValidationError as exc:
        errors = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'answer'}: {e['msg']}"
            for e in exc.errors()[:6]
        )
        return None, f"the answer does not match the required fields ({errors})"


@functools.cache
def response_format(
    answer: type[BaseModel], form: str, pin: tuple[tuple[str, Any], ...] = ()
) -> dict[str, Any]:
    """The structured-output request for an answer model in the endpoint's form (`llm.
    response_format`), built once: schema generation is costly enough to bound an actor's request
    rate. `json_schema` sends the constrained schema, whose branches carry the decision rules;
    the other forms send the model's plain schema, for endpoints that refuse a root `anyOf`.
    `pin` is the stage's pinned fields (`llm.stages.STAGE.pin`), as sorted items."""
    if form == "json_schema":
        schema = constrained_schema(answer, dict(pin))
    else:
        schema = answer.model_json_schema()
    if form == "json_object_schema":
        return {"type": "json_object", "schema": schema}
    return {"type": "json_schema", "json_schema": {"name": answer.__name__, "schema": schema}}


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value)
        return max(0.0, parsed.timestamp() - time.time()) if parsed else None


def probe_endpoint(cfg: LLMConfig, base_url: str) -> None:
    """One cheap request before a stage starts its actors: an endpoint that is not listening,
    refuses the key or is not an OpenAI-compatible API at all stops the stage in seconds, with
    one line naming it, instead of every row failing after its retries."""
    import openai  # the SDK is only needed here; actors import this module and never probe

    client = openai.OpenAI(
        base_url=base_url,
        api_key=os.environ.get(cfg.api_key_env) or "not-needed",
        max_retries=1,
        timeout=min(cfg.timeout_s, 15.0),
    )
    try:
        raw = client.models.with_raw_response.list()
    except (openai.APIConnectionError, openai.APITimeoutError) as exc:
        cause = exc.__cause__ or exc
        if "CERTIFICATE_VERIFY_FAILED" in str(cause):
            raise _untrusted(base_url, cause) from None
        raise LLMConfigError(
            f"cannot reach the LLM endpoint {base_url} ({type(cause).__name__}: "
            f"{str(cause)[:200]}); is the server running? check llm.base_url"
        ) from None
    except openai.APIStatusError as exc:
        if exc.status_code in (401, 403):
            raise _refused_key(cfg, base_url, exc.status_code) from None
        return  # many servers have no /models; the first real request will tell
    finally:
        client.close()
    if "json" not in raw.headers.get("content-type", ""):
        raise _not_openai(base_url, raw.http_response.text)


def _untrusted(base_url: str, cause: BaseException) -> LLMConfigError:
    """Python trusts the system's CAs, and SSL_CERT_FILE's instead when it is set: a private CA
    (an internal load balancer's) needs no setting of ours, only that variable on every node."""
    reason = str(cause).rsplit("certificate verify failed:", 1)[-1].split("(_ssl")[0].strip()
    return LLMConfigError(
        f"the TLS certificate of {base_url} is not trusted ({reason}); if a private CA issued "
        "it, set SSL_CERT_FILE to that CA's PEM bundle wherever the build runs"
    )


def _refused_key(cfg: LLMConfig, base_url: str, status: int) -> LLMConfigError:
    return LLMConfigError(
        f"{base_url} refused the API key (HTTP {status}); set ${cfg.api_key_env} or llm.api_key_env"
    )


def _not_openai(base_url: str, body: Any) -> LLMConfigError:
    text = " ".join(str(body).split())[:120]
    return LLMConfigError(
        f"{base_url} answered with a body that is not OpenAI-compatible JSON ({text!r}); "
        "check llm.base_url (an OpenAI-compatible server's URL usually ends in /v1)"
    )


class LLMClient:
    """Structured questions to one endpoint; safe to share by many concurrent coroutines."""

    def __init__(
        self,
        cfg: LLMConfig,
        *,
        base_url: str,
        api_key: str | None = None,
        limiter: RateLimiter | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.cfg = cfg
        self.base_url = base_url
        self._endpoint = ChatEndpoint(
            base_url,
            api_key or os.environ.get(cfg.api_key_env) or "not-needed",
            cfg.timeout_s,
            connections=cfg.max_in_flight,
        )
        self._limiter = limiter
        self._sleep = sleep
        self._rng = rng or random.Random()

    async def aclose(self) -> None:
        """Close the connections of the current event loop's session."""
        await self._endpoint.aclose()

    def backoff(self, retry: int) -> float:
        """Equal-jitter exponential back-off: half the capped step, plus up to half again."""
        step = min(self.cfg.backoff_cap_s, self.cfg.backoff_base_s * 2**retry)
        return step / 2 + self._rng.uniform(0, step / 2)

    async def _create(
        self,
        model: str,
        messages: list[dict[str, str]],
        answer: type[BaseModel],
        temperature: float,
        max_tokens: int,
        usage: Usage,
        pin: tuple[tuple[str, Any], ...] = (),
    ) -> ChatReply:
        last: Exception | None = None
        for retry in range(self.cfg.max_retries + 1):
            if self._limiter is not None:
                await self._limiter.acquire(
                    max_tokens + sum(len(m["content"]) for m in messages) // 4
                )
            form = response_format(answer, self.cfg.response_format, pin)
            worst = 0.0
            if usage.budget is not None:  # not sent unless its worst case fits under the cap
                bound = prompt_token_bound(messages, form)
                worst = worst_usd(self.cfg, model, bound, max_tokens)
                await usage.budget.reserve(worst)
            usage.calls += 1
            paid = 0.0
            try:
                reply = await self._endpoint.complete(
                    {
                        "model": model,
                        "messages": messages,
                        "temperature": temperature,
                        "max_tokens": max_tokens,
                        "response_format": form,
                    }
                )
                paid = call_usd(
                    self.cfg,
                    model,
                    reply.prompt_tokens,
                    reply.completion_tokens,
                    reply.cached_prompt_tokens,
                )
                return reply
            except NotChatCompletion as exc:  # HTML or prose with HTTP 200
                raise _not_openai(self.base_url, exc.body) from None
            except EndpointUnreachable as exc:
                last, wait = exc, None
            except EndpointStatusError as exc:
                if exc.status in (401, 403):
                    raise _refused_key(self.cfg, self.base_url, exc.status) from None
                if exc.status == 404:
                    raise LLMConfigError(
                        f"{self.base_url} has no model {model!r} or no chat endpoint (HTTP 404); "
                        "check llm.base_url and llm.model"
                    ) from None
                if exc.status not in RETRYABLE_STATUS:
                    raise LLMRequestError(f"{exc} (not retried)") from None
                last, wait = exc, _retry_after(exc.retry_after)
            finally:
                if usage.budget is not None:
                    await usage.budget.settle(worst, paid)
            if retry == self.cfg.max_retries:
                break
            delay = min(wait, MAX_RETRY_AFTER_S) if wait is not None else self.backoff(retry)
            usage.retries += 1
            usage.backoffs.append(delay)
            await self._sleep(delay)
        raise LLMRequestError(
            f"gave up after {self.cfg.max_retries + 1} attempts: {str(last)[:300]}"
        )

    async def ask(
        self,
        stage: str,
        prompt: str,
        answer: type[M],
        *,
        usage: Usage,
        check: Callable[[M], list[str]] | None = None,
        fallback: Callable[[str], M | None] | None = None,
    ) -> Outcome[M]:
        """One question, re-asked with the objection until the answer is valid or asks run out."""
        model, temperature, max_tokens = self.cfg.for_stage(stage)
        pin = tuple(sorted(self.cfg.pin_for(stage).items()))
        messages = [{"role": "user", "content": prompt}]
        text = ""
        for ask in range(self.cfg.max_reasks + 1):
            try:
                reply = await self._create(
                    model, messages, answer, temperature, max_tokens, usage, pin
                )
            except LLMRequestError as exc:
                return Outcome(None, "failed", str(exc), text or None)
            usage.prompt_tokens += reply.prompt_tokens
            usage.completion_tokens += reply.completion_tokens
            usage.cached_prompt_tokens += reply.cached_prompt_tokens
            text = reply.text
            problem: str | None
            if reply.finish_reason == "length":
                value, problem = (
                    None,
                    (
                        f"the answer was cut off at {max_tokens} tokens (truncated JSON); answer "
                        "more briefly"
                    ),
                )
                max_tokens = min(max_tokens * 2, 8192)
            else:
                value, problem = parse_answer(text, answer)
                if value is None and fallback is not None:
                    value = fallback(text)
                    problem = None if value is not None else problem
                if value is not None and check is not None:
                    issues = check(value)
                    problem = "; ".join(issues) if issues else None
                    value = None if issues else value
            if value is not None:
                return Outcome(value, "ok", None, text)
            if ask == self.cfg.max_reasks:
                return Outcome(None, "invalid", problem, text)
            usage.reasks += 1
            messages = [
                *messages,
                {"role": "assistant", "content": text[:4000]},
                {
                    "role": "user",
                    "content": f"That answer cannot be accepted: {problem}. Reply again with "
                    "one corrected JSON object only.",
                },
            ]
        raise AssertionError("unreachable")
