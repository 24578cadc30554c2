"""check load's stall timeout without a timer per read (dsv4ctl/check/driver.py ``_Stall``, issue
48.4): a streamed answer arms a few timers, not one per network read as aiohttp's ``sock_read``
did; progress still resets the stall clock, and silence still ends the turn as ``stuck``."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from dsv4ctl.check.driver import make_client, run_turn

CHUNK = {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "w "}}]}
LAST = {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}


async def _serve(events: int, gap: float, then_silent: float = 0.0):
    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(events):
            await resp.write(b"data: " + json.dumps(CHUNK).encode() + b"\n\n")
            await asyncio.sleep(gap)
        await asyncio.sleep(then_silent)
        await resp.write(b"data: " + json.dumps(LAST).encode() + b"\n\ndata: [DONE]\n\n")
        return resp
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}/v1/chat/completions"


async def _turn(events: int, gap: float, stall: float, then_silent: float = 0.0):
    runner, url = await _serve(events, gap, then_silent)
    loop = asyncio.get_running_loop()
    armed = []
    real = loop.call_at

    def call_at(when, cb, *args, **kw):
        armed.append(getattr(cb, "__qualname__", repr(cb)))
        return real(when, cb, *args, **kw)
    try:
        async with make_client(1, stall) as http:
            await run_turn(http, url, {"rid": "warm", "messages": []}, True, 30)   # the connection is made
            loop.call_at = call_at
            try:
                result, timing = await run_turn(http, url, {"rid": "r1", "messages": []}, True, 30)
            finally:
                loop.call_at = real
    finally:
        await runner.cleanup()
    return result, timing, armed


def test_a_streamed_answer_arms_a_few_timers_not_one_per_read():
    result, timing, armed = asyncio.run(_turn(events=40, gap=0.005, stall=5))
    assert result.error is None and result.content == "w " * 40 and timing["chunks"] == 41
    client = [a for a in armed if a != "_set_result_unless_cancelled"]     # (the server's sleeps: same loop)
    assert len(client) <= 4, client        # aiohttp's sock_read: a timer per read (about 40 here)


def test_progress_resets_the_stall_clock_and_silence_ends_the_turn():
    result, _, _ = asyncio.run(_turn(events=5, gap=0.2, stall=0.5))         # 1 s, never 0.5 s silent
    assert result.error is None and not result.stalled
    result, timing, _ = asyncio.run(_turn(events=2, gap=0.01, stall=0.3, then_silent=0.8))
    assert result.stalled and result.error == "no progress for 0.3 s"
    assert 0.3 <= timing["e2e_s"] < 0.8
