"""The chat-completions call itself: one aiohttp POST, decoded into the few fields we use.

Why not the `openai` SDK here: profiled in an actor at 64 requests in flight (benchmarks/
llm_throughput.py), the SDK spent ~4 ms of CPU per request — recursive request transforms,
httpx's connection-pool bookkeeping, response model building — so one actor topped out near
150 requests/s on this machine, half of what 64 requests in flight at 200 ms allow. This path
sends the same JSON and reads the same reply for a fraction of that. The SDK is still used for
the one synchronous probe before a stage (`client.probe_endpoint`).
"""

from __future__ import annotations

import asyncio
import json
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import aiohttp


@dataclass(frozen=True)
class ChatReply:
    """What a chat completion gives back that the client reads."""

    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int = 0  # of prompt_tokens, served from the endpoint's prompt cache


class EndpointUnreachable(Exception):
    """No HTTP answer: refused or dropped connection, or the request timed out."""


class EndpointStatusError(Exception):
    """An HTTP error status, with the server's Retry-After (raw) and the start of its body."""

    def __init__(self, status: int, retry_after: str | None, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status, self.retry_after, self.body = status, retry_after, body


class NotChatCompletion(Exception):
    """HTTP 200 whose body is not an OpenAI chat completion (a proxy's page, a wrong URL)."""

    def __init__(self, body: str) -> None:
        super().__init__(body[:200])
        self.body = body


class ChatEndpoint:
    """POST {base_url}/chat/completions with a pooled keep-alive session.

    aiohttp sessions belong to one event loop: a session is made on first use in each loop (an
    actor has one loop for its life; a test may run several), and `aclose` ends the current one.
    """

    def __init__(self, base_url: str, api_key: str, timeout_s: float, connections: int) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self._headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None
        # the loop the session belongs to (aiohttp deprecates session.loop)
        self._loop: asyncio.AbstractEventLoop | None = None

    def _current(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._session
        if session is None or session.closed or self._loop is not loop:
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._connections),
                headers=self._headers,
                timeout=self._timeout,
                json_serialize=json.dumps,
            )
            self._session, self._loop = session, loop
        return session

    async def complete(self, body: dict[str, Any]) -> ChatReply:
        try:
            async with self._current().post(self.url, json=body) as response:
                raw = await response.read()
                status, retry_after = response.status, response.headers.get("Retry-After")
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
            raise EndpointUnreachable(_describe(exc)) from None
        text = raw.decode("utf-8", "replace")
        if status >= 400:
            raise EndpointStatusError(status, retry_after, text)
        try:
            data = json.loads(text)
            choice = data["choices"][0]
            content = choice["message"].get("content") or ""
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise NotChatCompletion(text) from None
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}  # absent on many servers: none cached
        return ChatReply(
            text=content,
            finish_reason=choice.get("finish_reason"),
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            cached_prompt_tokens=int(details.get("cached_tokens") or 0)
            if isinstance(details, dict)
            else 0,
        )

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    def __del__(self) -> None:
        """An actor is never told it is done: when its client is collected while its loop still
        runs, the session is closed there. Elsewhere the caller owns `aclose`."""
        session = self._session
        if session is None or session.closed:
            return
        with suppress(RuntimeError):  # the loop is closed or gone: aiohttp reports the leak
            asyncio.get_running_loop().create_task(session.close())


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "TimeoutError: the request timed out"
    return f"{type(exc).__name__}: {exc}"
