"""``dsv4ctl check smoke``: one pass over a deployment's endpoints (aiohttp; imported by the command).

Checks, each pass / fail / skip with a one-line reason:

* ``health`` on every worker (``GET /health`` → 200; reference §4.1);
* ``models`` on the entry URL (router or server): ``GET /v1/models`` lists a model;
* ``server_info`` on every worker (``GET /server_info``, else ``/get_server_info``): version 0.5.23,
  ``tool_call_parser`` deepseekv4 and ``reasoning_parser`` deepseek-v4 (without them raw DSML and
  thinking reach clients, reference §5.1/§8.5), disaggregation mode and HiCache flags as running;
  with a profile, the running HiCache switch must equal the serve config's;
* ``chat``: one plain completion through the entry URL (no markup or think tags in content);
* ``tool_call`` and ``tool_call_stream``: one forced tool turn, JSON and SSE, must give valid
  ``tool_calls`` and ``finish_reason: "tool_calls"`` (field report T1).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Optional

import aiohttp

from . import classify as C
from .driver import BadResponse, ConnectError, fetch_json, run_turn
from .workload import TOOLS, Session

EXPECT_VERSION = "0.5.23"
EXPECT = {"tool_call_parser": "deepseekv4", "reasoning_parser": "deepseek-v4"}


@dataclass
class Worker:
    """A server to probe: ``name`` (group), ``url``, and the serve config's HiCache switch if known."""

    name: str
    url: str
    hicache_configured: Optional[bool] = None


def line(check: str, target: str, status: str, reason: str, **detail: Any) -> dict:
    """One smoke line: ``status`` is pass / fail / skip; ``detail`` carries what was observed."""
    return {"check": check, "target": target, "status": status, "reason": reason, "detail": detail}


def _short(v: Any, n: int = 80) -> Any:
    """A server-reported value for a reason line: strings over ``n`` characters and containers are
    cut to ``n`` characters (of their repr) with "..." appended; other values as they are."""
    if isinstance(v, str):
        return v if len(v) <= n else v[:n] + "..."
    if isinstance(v, (list, dict)):
        r = repr(v)
        return v if len(r) <= n else r[:n] + "..."
    return v


def judge_server_info(info: Any, worker: Worker) -> dict:
    """Pure: the ``server_info`` line for one worker's decoded JSON."""
    if not isinstance(info, dict):
        return line("server_info", worker.name, "fail", "not a JSON object")
    detail = {k: info.get(k) for k in ("version", "tool_call_parser", "reasoning_parser", "disaggregation_mode",
                                      "enable_hierarchical_cache", "hicache_ratio", "hicache_write_policy",
                                      "hicache_storage_backend", "served_model_name")}
    detail = {k: _short(v) for k, v in detail.items()}
    problems = []
    if info.get("version") != EXPECT_VERSION:
        problems.append(f"version {_short(info.get('version'))!r}, expected {EXPECT_VERSION}")
    for k, want in EXPECT.items():
        if info.get(k) != want:
            problems.append(f"{k} {_short(info.get(k))!r}, expected {want!r}")
    running = bool(info.get("enable_hierarchical_cache"))
    if worker.hicache_configured is not None and running != worker.hicache_configured:
        problems.append(f"HiCache running {'on' if running else 'off'} but the serve config says "
                        f"{'on' if worker.hicache_configured else 'off'}")
    summary = (f"{info.get('version')}, parsers {info.get('tool_call_parser')}/{info.get('reasoning_parser')}, "
               f"disaggregation {_short(info.get('disaggregation_mode'))}, HiCache {'on' if running else 'off'}"
               + (f" (ratio {_short(info.get('hicache_ratio'))}, {_short(info.get('hicache_write_policy'))})" if running else ""))
    if problems:
        return line("server_info", worker.name, "fail", "; ".join(problems), **detail)
    return line("server_info", worker.name, "pass", summary, **detail)


async def run_smoke(entry: str, workers: list[Worker], *, model: Optional[str] = None,
                    timeout: float = 60.0, api_key: Optional[str] = None) -> tuple[list[dict], bool]:
    """All smoke lines and whether the entry URL was reachable at all. ``api_key``: bearer token.
    ``timeout``: seconds for each probe's complete answer (also the no-progress limit); a body over
    the size limits of :mod:`.classify` fails its line."""
    from .driver import auth_headers
    out: list[dict] = []
    specs = C.tool_specs(TOOLS)
    async with aiohttp.ClientSession(headers=auth_headers(api_key), timeout=aiohttp.ClientTimeout(
            total=None, sock_connect=10, sock_read=timeout)) as http:
        for w in workers:
            try:
                status, _ = await fetch_json(http, w.url + "/health", timeout=timeout)
                out.append(line("health", w.name, "pass" if status == 200 else "fail",
                                "200" if status == 200 else f"HTTP {status}", url=w.url))
            except (ConnectError, BadResponse) as e:
                out.append(line("health", w.name, "fail", str(e), url=w.url))
        reachable = True
        try:
            status, doc = await fetch_json(http, entry + "/v1/models", timeout=timeout)
            data = doc.get("data") if isinstance(doc, dict) else None
            ids = [m.get("id") for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)] \
                if isinstance(data, list) else []
            if status == 200 and ids:
                out.append(line("models", entry, "pass", ", ".join(map(str, ids)), models=ids))
                model = model or ids[0]
            else:
                out.append(line("models", entry, "fail", f"HTTP {status}, no model listed"))
        except ConnectError as e:
            out.append(line("models", entry, "fail", str(e)))
            reachable = False
        except BadResponse as e:
            out.append(line("models", entry, "fail", str(e)))
        for w in workers:
            try:
                info = None
                for path in ("/server_info", "/get_server_info"):
                    status, doc = await fetch_json(http, w.url + path, timeout=timeout)
                    if status == 200:
                        info = doc
                        break
                if info is None:
                    out.append(line("server_info", w.name, "skip", f"no /server_info (HTTP {status})"))
                else:
                    out.append(judge_server_info(info, w))
            except (ConnectError, BadResponse) as e:
                out.append(line("server_info", w.name, "fail", str(e)))
        if not reachable:
            return out, False
        url = entry + "/v1/chat/completions"
        model = model or "default"
        body = {"model": model, "messages": [{"role": "user", "content": "Reply with one short sentence."}],
                "max_tokens": 64, "temperature": 0.0, "stream": False, "rid": f"dsv4ctl-smoke-{uuid.uuid4().hex[:8]}"}
        res, timing = await run_turn(http, url, body, False, timeout)
        v = C.classify(res, requires_tool=False, tools=specs)
        out.append(line("chat", entry, "pass" if v.ok else "fail",
                        f"{res.finish_reason}, {len(res.content)} chars, {timing['e2e_s']:.2f} s" if v.ok else
                        f"{v.cls}: {v.reason}", rid=body["rid"]))
        for name, stream in (("tool_call", False), ("tool_call_stream", True)):
            s = Session(sid=0, turns=2, stream=stream)
            rid = f"dsv4ctl-smoke-{uuid.uuid4().hex[:8]}"
            res, timing = await run_turn(http, url, s.request(model, rid), stream, timeout)
            v = C.classify(res, requires_tool=True, tools=specs)
            ok = v.ok and res.finish_reason == "tool_calls"
            reason = (f"{res.tool_calls[0].name}({res.tool_calls[0].arguments[:60]}), finish_reason tool_calls"
                      if ok else (f"{v.cls}: {v.reason}" if not v.ok else
                                  f"finish_reason {res.finish_reason!r}, expected 'tool_calls'"))
            out.append(line(name, entry, "pass" if ok else "fail", reason, rid=rid))
    return out, True
