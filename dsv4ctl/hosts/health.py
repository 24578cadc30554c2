"""Health gate over HTTP (aiohttp): each worker's ``GET /health`` (200 = healthy, 503 while
starting; SGLang 0.5.23 ``srt/entrypoints/http_server.py``, ops reference §4.1), then a 1-token
chat completion ``POST /v1/chat/completions`` through the router (ops reference §3.4, §4.1:
PD workers must be reached through the router)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Target:
    """One serving group to wait for. ``alive()`` → True while its processes run, else False
    (its process exited) or ``(host, reason)``: another host's process of the server exited (a
    node of a multi-node server), the failure is reported on that host."""

    host: str
    group: str
    url: str
    alive: Callable[[], "bool | tuple[str, str]"] | None = None
    api_key: str | None = field(default=None, repr=False)     # bearer token of the chat completion


@dataclass
class Failure:
    host: str
    group: str
    reason: str


async def _wait_one(session, t: Target, deadline: float, poll: float, loop, timeout: float = 0,
                    status: dict | None = None) -> Failure | None:
    import aiohttp
    last = "no answer"
    next_alive = time.monotonic() + 1.0
    while True:
        try:
            async with session.get(t.url + "/health", timeout=aiohttp.ClientTimeout(total=5)) as r:
                if r.status == 200:
                    return None
                last = f"/health answered {r.status}"
        except Exception as e:
            last = "/health: " + ("not listening yet" if isinstance(e, aiohttp.ClientConnectorError)
                                  else f"{type(e).__name__}")
        if status is not None:
            status[(t.host, t.group)] = last
        now = time.monotonic()
        if t.alive is not None and now >= next_alive:
            next_alive = now + 1.0
            try:
                ok = await loop.run_in_executor(None, t.alive)
            except Exception as e:
                return Failure(t.host, t.group, f"cannot check the process: {e}")
            if isinstance(ok, tuple):
                return Failure(ok[0], t.group, ok[1])
            if not ok:
                return Failure(t.host, t.group, "server process exited")
        if now >= deadline:
            return Failure(t.host, t.group, f"not healthy after the health timeout of {timeout:g} s ({last})")
        await asyncio.sleep(poll)


async def _chat(session, t: Target, deadline: float, model: str, poll: float) -> Failure | None:
    import aiohttp
    body = {"model": model, "messages": [{"role": "user", "content": "ping"}],
            "max_tokens": 1, "temperature": 0, "stream": False}
    last = "no answer"
    while True:
        try:
            headers = {"Authorization": f"Bearer {t.api_key}"} if t.api_key else {}
            async with session.post(t.url + "/v1/chat/completions", json=body, headers=headers,
                                    timeout=aiohttp.ClientTimeout(total=30)) as r:
                if r.status == 200:
                    doc = await r.json(content_type=None)
                    if doc.get("choices"):
                        return None
                    last = "chat completion without choices"
                else:
                    text = (await r.text())[:120]
                    if t.api_key:         # a server may echo the request back: never show the key
                        text = text.replace(t.api_key, "***")
                    last = f"chat completion answered {r.status}: {text}"
                    if r.status in (401, 403):     # a wrong or missing key: waiting cannot fix it
                        return Failure(t.host, t.group, last)
        except Exception as e:
            last = f"chat completion: {type(e).__name__}: {e}"
            if t.api_key:
                last = last.replace(t.api_key, "***")
        if time.monotonic() >= deadline:
            return Failure(t.host, t.group, last)
        await asyncio.sleep(poll)


def gate(workers: list[Target], chat: list[Target], timeout: float, model: str = "default",
         poll: float = 0.1, ended: dict | None = None, status: dict | None = None) -> list[Failure]:
    """Wait until every worker's /health is 200 (or its process exits, or ``timeout`` s pass),
    then one 1-token chat completion through each ``chat`` target (the router). [] = healthy.
    ``poll`` (s) between /health probes of one target: a probe is one small GET, and a
    restarted group is seen healthy at most ``poll`` s after it is. ``ended`` (optional) gets
    ``(kind, host, group) -> time.monotonic()`` when each target is done (kind ``health`` or
    ``chat``); ``status`` (optional) gets ``(host, group) -> what the last /health probe saw``
    while a worker is not healthy (for progress lines)."""
    ended = {} if ended is None else ended

    async def done(kind, t, make):
        try:       # the probe coroutine is made here, so an interrupt never leaves one un-awaited
            return await make()
        finally:
            ended[(kind, t.host, t.group)] = time.monotonic()

    async def main():
        import aiohttp
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as s:
            fails = [f for f in await asyncio.gather(*[
                done("health", t, lambda t=t: _wait_one(s, t, deadline, poll, loop, timeout, status)) for t in workers]) if f]
            if fails:
                return fails
            fails = [f for f in await asyncio.gather(*[
                done("router", t, lambda t=t: _wait_one(s, t, deadline, poll, loop, timeout)) for t in chat]) if f]
            if fails:  # the router's own /health first
                for t in chat:
                    ended[("chat", t.host, t.group)] = time.monotonic()
                return fails
            return [f for f in await asyncio.gather(*[
                done("chat", t, lambda t=t: _chat(s, t, deadline, model, poll)) for t in chat]) if f]
    return asyncio.run(main())


def wait_health(urls: dict[str, str], timeout: float, poll: float = 0.5) -> dict[str, str | None]:
    """{group: None when ``GET url/health`` answered 200 within ``timeout`` s, else the reason}
    (the workers' half of :func:`gate`)."""
    fails = gate([Target("", g, u) for g, u in urls.items()], [], timeout, poll=poll)
    out: dict[str, str | None] = {g: None for g in urls}
    for f in fails:
        out[f.group] = f.reason
    return out
