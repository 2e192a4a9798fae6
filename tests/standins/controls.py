"""The control endpoints every test stand-in serves (`POST /_NAME`, `GET /_stats`).

The stand-ins (the scripted LLM, the S2 API) each hold their own script state; what a test does
to them is the same: post a small JSON body that queues faults, sets a latency, pauses, resets;
read the counts back. One way to register those, so a new stand-in or control is one function
and the fixtures in conftest talk to every stand-in alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

# a control gets the posted JSON body (None when there is none) and returns the reply's body,
# or None for {"ok": true}
Control = Callable[[Any], Any]


def add_controls(
    app: web.Application, controls: Mapping[str, Control], stats: Callable[[], dict[str, Any]]
) -> None:
    """Serve each control at `POST /_NAME` and the stand-in's counts at `GET /_stats`."""
    for name, control in controls.items():
        app.router.add_post(f"/_{name}", _handler(control))

    async def read_stats(request: web.Request) -> web.Response:
        return web.json_response(stats())

    app.router.add_get("/_stats", read_stats)


def _handler(control: Control) -> Callable[[web.Request], Any]:
    async def handle(request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        reply = control(body)
        return web.json_response({"ok": True} if reply is None else reply)

    return handle
