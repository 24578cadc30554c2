"""Hostile test server for ``dsv4ctl check``: NOT a stand-in for SGLang, but a deliberately broken
or malicious HTTP server that attacks the client (endless SSE, oversized bodies, bytes dripped
forever, JSON of the wrong shape, bytes that are not UTF-8).

One aiohttp server in a background thread; the first path segment picks the misbehaviour, so
``http://127.0.0.1:PORT/<mode>`` is a base URL whose ``/health``, ``/v1/models``, ``/server_info``
and ``/v1/chat/completions`` misbehave as ``<mode>`` says (everything not named by the mode answers
like a well-formed SGLang 0.5.23 server). Modes: see :data:`MODES`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from typing import Iterator

from aiohttp import web

MIB = 1 << 20
GOOD_INFO = {"version": "0.5.23", "tool_call_parser": "deepseekv4", "reasoning_parser": "deepseek-v4"}
GOOD_CHAT = {"id": "x", "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                     "finish_reason": "stop"}]}

MODES = {
    "good": "well-formed answers everywhere",
    "flood": "chat: endless SSE content chunks (also for stream=false)",
    "noline": "chat: one SSE line that never ends",
    "hugejson": "chat: a 20 MiB JSON body",
    "hugeinfo": "/server_info: a 20 MiB body",
    "hugemodels": "/v1/models: a 20 MiB body",
    "drip": "chat: one byte every 0.2 s, forever",
    "nullchoice": 'chat: {"choices": [null]}',
    "usage_str": 'chat: a valid answer with "usage": "lots" (SSE too)',
    "weird_types": "chat: content a list, name an int, finish_reason an int",
    "models_garbage": "/v1/models: bytes that are not UTF-8",
    "models_weird": "/v1/models: a model id that is an object",
    "auth401": "everything but /health: HTTP 401 (a server started with --api-key, no or another key sent)",
    "auth403": "everything but /health: HTTP 403",
    "authchat": "chat: HTTP 401 (a gateway whose own endpoints are open, its workers need a key)",
    "authsome": "chat: the first request answered, then every second one HTTP 401",
    "echo": "chat: HTTP 500 whose body echoes the request's Authorization header",
    "longerror": "chat: HTTP 500 with a long error message (100 words)",
}
_COUNT: dict[str, int] = {}


async def _write_forever(resp: web.StreamResponse, piece: bytes, delay: float = 0.0) -> None:
    try:
        while True:
            await resp.write(piece)
            if delay:
                await asyncio.sleep(delay)
    except (ConnectionError, RuntimeError):
        pass


async def _big(request: web.Request, head: bytes, size: int, tail: bytes) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    await resp.prepare(request)
    try:
        await resp.write(head)
        for _ in range(size // MIB):
            await resp.write(b"x" * MIB)
        await resp.write(tail)
    except (ConnectionError, RuntimeError):
        pass
    return resp


async def handle(request: web.Request) -> web.StreamResponse:
    mode, _, rest = request.path.lstrip("/").partition("/")
    rest = "/" + rest
    if rest == "/health":
        return web.Response(text="")
    if mode in ("auth401", "auth403"):
        return web.json_response({"error": "Unauthorized"}, status=int(mode[4:]))
    if rest == "/v1/chat/completions" and mode in ("authchat", "authsome"):
        _COUNT[mode] = n = _COUNT.get(mode, 0) + 1
        if mode == "authchat" or n % 2 == 0:
            return web.json_response({"error": "Unauthorized"}, status=401)
    if rest == "/v1/chat/completions" and mode == "longerror":
        return web.json_response({"error": {"message": " ".join(f"word{i:03d}" for i in range(100))}}, status=500)
    if rest == "/v1/chat/completions" and mode == "echo":
        auth = request.headers.get("Authorization", "")
        return web.json_response({"error": {"message": f"bad request; headers: {{'Authorization': '{auth}'}}"}},
                                 status=500)
    if rest == "/v1/models":
        if mode == "models_garbage":
            return web.Response(body=b"\x00\xff\xfe garbage", content_type="application/json")
        if mode == "models_weird":
            return web.json_response({"data": [{"id": {"nested": [1]}}]})
        if mode == "hugemodels":
            return await _big(request, b'{"data": [{"id": "', 20 * MIB, b'"}]}')
        return web.json_response({"object": "list", "data": [{"id": "m"}]})
    if rest in ("/server_info", "/get_server_info"):
        if mode == "hugeinfo":
            return await _big(request, b'{"version": "', 20 * MIB, b'"}')
        return web.json_response(GOOD_INFO)
    if rest != "/v1/chat/completions":
        return web.Response(status=404)
    body = await request.json()
    stream = bool(body.get("stream"))
    if mode in ("flood", "noline", "drip"):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if mode == "flood":
            chunk = ("data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": "x" * 4000}}]})
                     + "\n\n").encode()
            await _write_forever(resp, chunk * 64)
        elif mode == "noline":
            await resp.write(b"data: ")
            await _write_forever(resp, b"x" * 65536)
        else:
            await _write_forever(resp, b" ", 0.2)
        return resp
    if mode == "hugejson":
        return await _big(request, b'{"choices": [{"message": {"content": "', 20 * MIB, b'"}}]}')
    if mode == "nullchoice":
        doc = {"choices": [None]}
    elif mode == "weird_types":
        doc = {"choices": [{"index": 0, "message": {"content": ["a"], "tool_calls": [
            {"function": {"name": 5, "arguments": {"x": 1}}}]}, "finish_reason": 7}]}
    else:
        doc = dict(GOOD_CHAT, usage="lots") if mode == "usage_str" else GOOD_CHAT
    if not stream:
        return web.json_response(doc)
    if mode == "nullchoice":
        events = [doc]
    elif mode == "weird_types":
        events = [{"choices": [{"index": 0, "delta": {"content": ["a"]}}]}]
    else:
        events = [{"id": "x", "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]}]
        if mode == "usage_str":
            events.append({"id": "x", "choices": [], "usage": "lots"})
    text = "".join("data: " + json.dumps(e) + "\n\n" for e in events) + "data: [DONE]\n\n"
    return web.Response(text=text, content_type="text/event-stream")


@contextlib.contextmanager
def hostile_server() -> Iterator[str]:
    """Run the hostile test server on 127.0.0.1 (a free port) in a thread; yields its root URL
    (append ``/<mode>`` for a base URL)."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    state: dict = {}

    async def start() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        state["runner"] = runner
        state["port"] = site._server.sockets[0].getsockname()[1]

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(state["runner"].cleanup())
        loop.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    if not ready.wait(10):
        raise RuntimeError("hostile test server did not start")
    try:
        yield f"http://127.0.0.1:{state['port']}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        t.join(10)


# --- connection-level attacks: a raw TCP server (aiohttp's web server cannot send broken HTTP) ---
RAW_MODES = {
    "disconnect": "reads the request, closes without a byte (ServerDisconnectedError)",
    "badstatus": "a status line that is not HTTP ('HTTP/1.1 abc')",
    "bigheader": "a 100 KiB header line (over aiohttp's 8190-byte limit)",
    "badchunk": "Transfer-Encoding: chunked with a chunk size that is not hex",
    "redirect": "302 to itself, forever (a redirect loop)",
    "reset": "reads the request, then a TCP reset (SO_LINGER 0)",
    "garbage": "bytes that are not HTTP at all",
}


def _raw_answer(mode: str, path: str) -> bytes | None:
    if mode == "badstatus":
        return b"HTTP/1.1 abc\r\n\r\n"
    if mode == "bigheader":
        return b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (100 << 10) + b"\r\nContent-Length: 2\r\n\r\n{}"
    if mode == "badchunk":
        return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"zz\r\n{}\r\n0\r\n\r\n")
    if mode == "redirect":
        return b"HTTP/1.1 302 Found\r\nLocation: " + path.encode() + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    if mode == "garbage":
        return b"\x00\x01\x02 this is not HTTP \xff\xfe\r\n\r\n"
    return None


@contextlib.contextmanager
def raw_server() -> Iterator[str]:
    """A raw TCP server on 127.0.0.1 in a thread; the first path segment of each request picks a
    :data:`RAW_MODES` attack. Yields its root URL (append ``/<mode>`` for a base URL)."""
    import socket
    import struct

    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(256)
    srv.settimeout(0.2)
    port = srv.getsockname()[1]
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            buf = b""
            try:
                while b"\r\n\r\n" not in buf and len(buf) < 65536:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                first = buf.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
                path = first[1] if len(first) > 1 else "/"
                mode = path.lstrip("/").split("/", 1)[0]
                if mode == "reset":
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                answer = _raw_answer(mode, path)
                if answer is not None:
                    conn.sendall(answer)
            except OSError:
                pass

    def run() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except (socket.timeout, OSError):
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()
        srv.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        t.join(5)


def closed_port() -> int:
    """A 127.0.0.1 port nothing listens on (bound, then closed)."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port
