"""A minimal **stand-in** for an SGLang 0.5.23 server / router, started by the deploy launcher.

A GPU SGLang server cannot run here; this speaks the parts of its wire format the deploy gate
uses (ops reference §4.1): ``GET /health`` (200 empty body when healthy, 503 while starting),
``GET /v1/models``, ``POST /v1/chat/completions`` (OpenAI chat, non-streaming). With
``--router URL`` it acts as the router: ``/v1/models`` and chat requests are forwarded to the
worker URL, the response streamed through (SSE included), so a router in front of the DSV4
stand-in of tests/standin serves ``dsv4ctl check`` traffic.

Test knobs, read from the ``--config`` YAML (so a release's serve config decides):
``standin-startup-s`` (503 for that long), ``standin-never-healthy`` (503 forever),
``standin-crash`` (print the message to stderr as SGLang would log a fatal error, exit 1),
and, from the environment (a group's ``env``), ``STANDIN_CRASH_NODE`` (only the node of that
``--node-rank`` fails to start).
``--nnodes/--node-rank/--dist-init-addr``: SGLang's multi-node behaviour (tests/standin/multinode.py):
node 0 serves HTTP only once every node has joined; the other nodes serve no HTTP.

    python -m tests.sshd.standin_sglang --config X.yaml --host 127.0.0.2 --port 30000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import yaml
from aiohttp import ClientSession, web

from tests.standin import multinode


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--router", action="append", default=[], help="worker URL (router mode)")
    multinode.add_args(ap)
    a = ap.parse_args(argv)
    cfg = {}
    if a.config:
        with open(a.config) as f:
            cfg = yaml.safe_load(f) or {}
    model = cfg.get("served-model-name") or cfg.get("model-path") or "default"
    print(f"stand-in: server_args model={model} port={a.port} config={a.config}", flush=True)
    if cfg.get("enable-hierarchical-cache") is True and os.environ.get("STANDIN_CRASH_ON_HICACHE"):
        cfg["standin-crash"] = os.environ["STANDIN_CRASH_ON_HICACHE"]     # a HiCache start-up failure
    if cfg.get("standin-crash"):
        print("Loading safetensors checkpoint shards:   0% Completed | 0/64", flush=True)
        print(f"RuntimeError: {cfg['standin-crash']}", file=sys.stderr, flush=True)
        return 1
    if a.nnodes > 1 and os.environ.get("STANDIN_CRASH_NODE") == str(a.node_rank):   # one node fails to start
        print(f"[node {a.node_rank}] RuntimeError: CUDA error: uncorrectable ECC error encountered",
              file=sys.stderr, flush=True)
        return 1
    if a.node_rank > 0:
        return multinode.run_member(a.nnodes, a.node_rank, a.dist_init_addr)
    t0 = time.monotonic()
    startup = float(cfg.get("standin-startup-s", os.environ.get("STANDIN_STARTUP_S", 0)))
    never = bool(cfg.get("standin-never-healthy"))
    node0 = multinode.Node0(a.nnodes, a.dist_init_addr)

    def healthy() -> bool:
        return not never and time.monotonic() - t0 >= startup and node0.ready

    async def health(req):
        if a.router or healthy():
            return web.Response(status=200)
        return web.Response(status=503)

    async def forward(req, path):
        """Router mode: pass the request to the worker, streaming the body through (SSE too)."""
        async with ClientSession() as s:
            async with s.request(req.method, a.router[0] + path, data=await req.read(),
                                 headers={k: v for k, v in req.headers.items()
                                          if k.lower() in ("content-type", "authorization")}) as r:
                out = web.StreamResponse(status=r.status, headers={"Content-Type": r.headers.get("Content-Type", "")})
                await out.prepare(req)
                async for chunk in r.content.iter_any():
                    await out.write(chunk)
                await out.write_eof()
                return out

    async def models(req):
        if a.router:
            return await forward(req, "/v1/models")
        return web.json_response({"object": "list", "data": [{"id": model, "object": "model", "created": int(t0),
                                                               "owned_by": "sglang", "root": model}]})

    async def chat(req):
        if a.router:
            return await forward(req, "/v1/chat/completions")
        key = cfg.get("api-key")
        if key and req.headers.get("Authorization") != f"Bearer {key}":
            # SGLang answers 401; this one also echoes what it got, as a hostile proxy would
            return web.json_response({"error": "Unauthorized",
                                      "got": req.headers.get("Authorization", "(none)")}, status=401)
        body = await req.json()
        if not healthy():
            return web.json_response({"object": "error", "message": "server not ready", "code": 503}, status=503)
        n = int(body.get("max_tokens") or 16)
        prompt = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
        return web.json_response({
            "id": "chatcmpl-standin", "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"[:max(1, n)],
                                                 "reasoning_content": None, "tool_calls": None},
                         "logprobs": None, "finish_reason": "length", "matched_stop": None}],
            "usage": {"prompt_tokens": prompt, "total_tokens": prompt + 1, "completion_tokens": 1,
                      "prompt_tokens_details": None}})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/health_generate", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)

    async def on_start(app):
        await node0.join()               # before the site binds: SGLang's HTTP server comes last

        async def ready():
            while not (a.router or healthy()):
                await asyncio.sleep(0.05)
            print("The server is fired up and ready to roll!", flush=True)
        if not never:
            app["ready"] = asyncio.create_task(ready())
    app.on_startup.append(on_start)
    web.run_app(app, host=a.host, port=a.port, print=None, handle_signals=True, shutdown_timeout=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
