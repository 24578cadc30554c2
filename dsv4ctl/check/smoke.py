"""``dsv4ctl check smoke``: one pass over a deployment's endpoints (aiohttp; imported by the command).

Checks, each pass / fail / skip with a one-line reason:

* ``router``: when the entry URL is a PD gateway (:func:`.gateway.identify_gateway`: no
  ``/server_info``, a ``/workers`` list or ``/get_server_info`` saying ``router_manager``), what it
  is and the workers it lists; its own info is never judged as a worker's. Without workers given
  (a bare URL) the workers are the ones the gateway lists;
* ``health`` on every worker (``GET /health`` → 200; reference §4.1);
* ``models`` on the entry URL (router or server): ``GET /v1/models`` lists a model;
* ``server_info`` on every worker (``GET /server_info``, else ``/get_server_info``): the version
  of the release that runs (``expect_version``: the release's tree version; else any supported
  release, 0.5.18-0.5.23, reported with its output path), ``tool_call_parser`` deepseekv4 and ``reasoning_parser`` deepseek-v4 (without them raw DSML and
  thinking reach clients, reference §5.1/§8.5), disaggregation mode and HiCache flags as running;
  with a profile, the running HiCache switch must equal the serve config's;
* ``chat``: one plain completion through the entry URL (no markup or think tags in content);
* ``tool_call`` and ``tool_call_stream``: one forced tool turn, JSON and SSE, must give valid
  ``tool_calls`` and ``finish_reason: "tool_calls"`` (field report T1);
* ``tool_choice_none``: tools declared, ``tool_choice: "none"``, and an instruction that asks for a
  known-answer call anyway: no ``tool_calls`` and no DSML / think markup in ``content`` (with
  ``none`` 0.5.23 does not parse DSML, so a model that calls leaks it as text: sglang #35736);
* ``tool_choice_required``: at least one call, valid (the classifier finds nothing);
* ``tool_choice_named``: ``{"type": "function", "function": {"name": X}}``: valid calls, all of X;
* ``replay``: one known-answer request computed, answered again from the prefix cache (GPU radix
  cache or HiCache's host tier), and after ``/flush_cache`` on every worker: the same calls each
  time (the issue-6 incident corrupted answers built on restored KV);
* ``load_back`` (only where a worker runs HiCache): the known-answer request computed, then filler
  prompts of 1.5 times the device KV pool (``max_total_num_tokens``; the host tier must hold
  ``hicache_ratio`` >= 1.75 pools) evict it from the device tier, then the request again: its
  prefix now comes back from the host tier (``sglext.cached_tokens_details.host``), and the calls
  must be the same (``/flush_cache`` resets the host tier too, so ``replay`` never reaches this
  path: a load-back that loses the indexer keys passed it);
* ``over_length``: a prompt of about context length + 1,024 tokens must get HTTP 4xx, not 200 (in
  PD a prefill abort has come back from decode as HTTP 200 with garbage and ``prompt_tokens`` 1);
* ``over_pool``: a prompt between the KV pool's limit (``max_req_input_len`` of ``/server_info``)
  and the context length must get HTTP 4xx too (sglang#30233: the band a PD deployment answered
  with HTTP 200 and garbage); skipped when the pool holds a full-context request;
* ``prompt_tokens``: ``usage.prompt_tokens`` of every completion probe that was answered lies
  between 1 token per 16 bytes and 1 token per byte of the JSON sent (messages + tools).

The judging of each line is a pure function (``judge_*``); :func:`run_smoke` does the I/O.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass
from typing import Any, Optional

import aiohttp

from ..render import clip
from . import classify as C
from . import expect as E
from .driver import (AUTH_STATUSES, AuthRefused, BadResponse, ClientSideError, ConnectError, fetch_json, key_sent,
                     run_turn)
from .workload import CALL_INSTRUCTION, SYSTEM_PROMPT, TOOLS, Session, known_instruction

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
    """A server-reported value for a reason line: a string, or a container's repr, over ``n``
    characters is cut to ``n`` at a word or field boundary, ending in "…"
    (:func:`dsv4ctl.render.clip`); other values as they are."""
    if isinstance(v, str):
        return clip(v, n)
    if isinstance(v, (list, dict)):
        r = repr(v)
        return v if len(r) <= n else clip(r, n)
    return v


def output_path(version: Any) -> Optional[str]:
    """The DeepSeek-V4 output path of SGLang ``version`` (:class:`dsv4ctl.plan.versions.VersionRules`):
    ``deepseek-recipe`` (0.5.23: token-level ``deepseek_recipe.StreamProcessor``) or ``detector``
    (0.5.18-0.5.22: ``FunctionCallParser`` with the regex ``DeepSeekV4Detector``); None for a
    release dsv4ctl does not support."""
    from ..plan.versions import VERSIONS
    rules = VERSIONS.get(version) if isinstance(version, str) else None
    return rules.output_path if rules else None


def judge_server_info(info: Any, worker: Worker, expect_version: Optional[str] = None) -> dict:
    """Pure: the ``server_info`` line for one worker's decoded JSON. ``expect_version``: the SGLang
    release the deployment runs (its tree's version): the worker must report exactly it; None:
    any supported release (0.5.18-0.5.23) passes, and the line starts with the one it saw. The
    detail names the release's output path (:func:`output_path`)."""
    from ..plan.versions import supported
    if not isinstance(info, dict):
        return line("server_info", worker.name, "fail", "not a JSON object")
    detail = {k: info.get(k) for k in ("version", "tool_call_parser", "reasoning_parser", "disaggregation_mode",
                                      "enable_hierarchical_cache", "hicache_ratio", "hicache_write_policy",
                                      "hicache_storage_backend", "served_model_name")}
    detail = {k: _short(v) for k, v in detail.items()}
    detail.update(output_path=output_path(info.get("version")), expected_version=expect_version)
    problems = []
    if expect_version is not None and info.get("version") != expect_version:
        problems.append(f"version {_short(info.get('version'))!r}, expected {expect_version}")
    elif expect_version is None and detail["output_path"] is None:
        problems.append(f"version {_short(info.get('version'))!r}, expected a supported SGLang release ({supported()})")
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


def release_seen(lines: list[dict], expect_version: Optional[str], source: str) -> dict:
    """Pure: the smoke document's ``sglang`` object: the release expected (None: any supported)
    and where that came from (``source``), the versions the workers reported (``seen``, in the
    order first seen) and their output paths."""
    seen = list(dict.fromkeys(str(x["detail"]["version"]) for x in lines
                              if x["check"] == "server_info" and x["detail"].get("version") is not None))
    return {"expected": expect_version, "source": source, "seen": seen,
            "output_paths": {v: output_path(v) for v in seen}}


# --- probes: request bodies (pure) ------------------------------------------------------------
CHAT_PROMPT = ("Reply with one short sentence: what does a load balancer in front of two inference "
               "servers do with a request?")
PROBE_TASK = "Task: review how the smoke checks of dsv4ctl probe a server. "
NONE_PROBE_FACT = "The code to review is dsv4ctl/check/smoke.py, lines 12-40."
NONE_PROBE_CALLS = [{"name": "read_file",
                     "arguments": {"path": "dsv4ctl/check/smoke.py", "start_line": 12, "end_line": 40}}]
REQUIRED_PROBE_TOOL = "run_command"
NAMED_PROBE_TOOL = "search_code"

OVER_LENGTH_MARGIN = 1024            # tokens past the context length
CHARS_PER_TOKEN = 4                  # sizing of the over-length prompt
MAX_PROBED_CONTEXT = 1 << 20         # tokens; above it the over-length probe is skipped (over 4 MiB)
# Words of at most three letters: a BPE tokenizer gives at least one token per 4 characters of
# this, so (context + margin) x 4 characters are at least context + margin tokens.
FILLER = "we go to it and so do we, as we may. "
FILLER_CHARS_PER_TOKEN = 2.85        # FILLER with the DeepSeek-V4 tokenizer: 200,000 chars = 70,274 tokens
LOAD_BACK_FILL = 1.5                 # filler tokens of the load_back probe, in device KV pools (LRU: evicts it all)
LOAD_BACK_MIN_RATIO = 1.75           # hicache_ratio below which the host tier cannot keep the prompt meanwhile
LOAD_BACK_PER_REQUEST = 32768        # tokens of one filler prompt at most (and 80 % of max_req_input_len)
LOAD_BACK_MAX_REQUESTS = 256         # more filler requests than this: skipped (a pool too large to fill here)
LOAD_BACK_CONCURRENCY = 8            # filler requests in flight at once
BAND_SLACK = 0.10                    # the over_pool prompt's token count may be off by this share either way
MIN_BYTES_PER_TOKEN = 16             # prompt_tokens below 1 per 16 bytes of the JSON sent fails
MAX_TOKENS_PER_BYTE = 1              # prompt_tokens above 1 per byte fails


NO_THINKING = {"thinking": False}
"""``chat_template_kwargs`` of every probe: thinking off, said explicitly (SGLang's default; the
smg gateway otherwise turns it on for DeepSeek-V4 and refuses forced tool choices)."""


def _rid() -> str:
    return f"dsv4ctl-smoke-{uuid.uuid4().hex[:8]}"


def chat_body(model: str, rid: str) -> dict:
    """The plain ``chat`` probe."""
    return {"model": model, "messages": [{"role": "user", "content": CHAT_PROMPT}],
            "max_tokens": 64, "temperature": 0.0, "stream": False, "rid": rid, "chat_template_kwargs": NO_THINKING}


def tool_choice_body(kind: str, model: str, rid: str) -> dict:
    """The ``tool_choice_<kind>`` probe (``none``, ``required`` or ``named``): tools declared, the
    shared system prompt, one user turn. ``none`` asks for a known-answer call
    (:data:`NONE_PROBE_CALLS`); ``required`` / ``named`` name their tool."""
    if kind == "none":
        text, choice = known_instruction(NONE_PROBE_CALLS, NONE_PROBE_FACT), "none"
    elif kind == "required":
        text, choice = CALL_INSTRUCTION.format(name=REQUIRED_PROBE_TOOL), "required"
    elif kind == "named":
        text, choice = (CALL_INSTRUCTION.format(name=NAMED_PROBE_TOOL),
                        {"type": "function", "function": {"name": NAMED_PROBE_TOOL}})
    else:
        raise ValueError(f"unknown tool_choice probe {kind!r}")
    return {"model": model, "messages": [{"role": "system", "content": SYSTEM_PROMPT},
                                         {"role": "user", "content": PROBE_TASK + text}],
            "tools": TOOLS, "tool_choice": choice, "max_tokens": 512, "temperature": 0.0, "stream": False,
            "rid": rid, "chat_template_kwargs": NO_THINKING}


def over_length_body(model: str, rid: str, context_len: int) -> dict:
    """A prompt of (``context_len`` + :data:`OVER_LENGTH_MARGIN`) x :data:`CHARS_PER_TOKEN`
    characters (:data:`FILLER` repeated, then a one-line question)."""
    return _filler_body(model, rid, (context_len + OVER_LENGTH_MARGIN) * CHARS_PER_TOKEN)


def over_pool_body(model: str, rid: str, tokens: int) -> dict:
    """A prompt of about ``tokens`` DeepSeek-V4 tokens: ``tokens`` x
    :data:`FILLER_CHARS_PER_TOKEN` characters of :data:`FILLER` (measured, not a bound)."""
    return _filler_body(model, rid, int(tokens * FILLER_CHARS_PER_TOKEN))


def _filler_body(model: str, rid: str, n: int) -> dict:
    text = (FILLER * (n // len(FILLER) + 1))[:n] + " Reply with OK."
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 16,
            "temperature": 0.0, "stream": False, "rid": rid, "chat_template_kwargs": NO_THINKING}


def _call_set(res: C.TurnResult) -> list[tuple[str, Any]]:
    out = []
    for c in res.tool_calls:
        try:
            args: Any = C.loads_arguments(c.arguments)
        except (ValueError, RecursionError):
            args = c.arguments
        out.append((c.name, args))
    return out


def judge_replay(first: C.TurnResult, cached: C.TurnResult, flushed: Optional[C.TurnResult], target: str,
                 flush_why: Optional[str], **detail: Any) -> dict:
    """``replay``: the same known-answer request computed (``first``), answered again with its
    prompt cached (``cached``: the radix cache or HiCache's host tier restored it; the incident of
    issue 6 corrupted exactly these), and after ``/flush_cache`` (``flushed``; None when the flush
    did not happen: ``flush_why`` says why). Pass when every answer has the first one's calls
    (names and parsed arguments); skip when the first answer has no calls to compare."""
    base = _call_set(first)
    if not _answered(first) or not base:
        return line("replay", target, "skip", "the first answer has no tool calls to compare (see tool_call)", **detail)
    hit = ((cached.usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
    where = f"the cached replay ({hit} cached tokens)" if isinstance(hit, int) else "the cached replay"
    for label, res in ((where, cached), ("the replay after /flush_cache", flushed)):
        if res is None:
            continue
        got = _call_set(res)
        if not _answered(res) or got != base:
            what = (res.error or f"HTTP {res.http_status}") if not _answered(res) else \
                ", ".join(f"{n}({clip(json.dumps(a, ensure_ascii=False), 60)})" for n, a in got) or "no tool calls"
            return line("replay", target, "fail", f"{label} differs from the first computation: "
                        f"{what}; first: " + ", ".join(f"{n}({clip(json.dumps(a, ensure_ascii=False), 60)})"
                                                       for n, a in base), cached_tokens=hit, **detail)
    return line("replay", target, "pass", f"the same {len(base)} call(s) computed, from the cache"
                + (f" ({hit} cached tokens)" if isinstance(hit, int) else "")
                + (" and after /flush_cache" if flushed is not None else f"; not after a flush: {flush_why}"),
                cached_tokens=hit, **detail)


def load_back_plan(infos: list[Any], target: str) -> tuple[Optional[dict], Optional[dict]]:
    """How the ``load_back`` probe evicts the device tier: ``({"pool", "ratio", "fill", "per",
    "requests"}, None)`` (tokens), or ``(None, skipped line)``, or ``(None, None)`` when no worker
    runs HiCache (no line: no host tier to load back from). ``pool``: the smallest
    ``max_total_num_tokens`` of the HiCache workers' ``/server_info`` (SGLang's device KV pool, the
    one ``dsv4ctl plan`` sizes); ``fill`` = :data:`LOAD_BACK_FILL` x pool, sent as ``requests``
    prompts of ``per`` tokens (at most :data:`LOAD_BACK_PER_REQUEST` and 80 % of
    ``max_req_input_len``). Skipped when the pool is not reported, the host tier is smaller than
    :data:`LOAD_BACK_MIN_RATIO` pools (``hicache_ratio``; SGLang 0.5.23 resolves 2.0 by
    default), or more than :data:`LOAD_BACK_MAX_REQUESTS` prompts would be needed."""
    hc = [i for i in infos if isinstance(i, dict) and i.get("enable_hierarchical_cache") is True]
    if not hc:
        return None, None
    pools = [n for i in hc if (n := _int(i.get("max_total_num_tokens"))) and n > 0]
    if not pools:
        return None, line("load_back", target, "skip", "HiCache on but no server_info max_total_num_tokens "
                          "(the device KV pool to fill is unknown)")
    pool = min(pools)
    ratios = [float(r) for i in hc if isinstance(r := i.get("hicache_ratio"), (int, float)) and not isinstance(r, bool)]
    ratio = min(ratios) if ratios else None
    if ratio is not None and ratio < LOAD_BACK_MIN_RATIO:
        return None, line("load_back", target, "skip", f"hicache_ratio {ratio:g}: the host tier cannot keep the "
                          f"prompt while {LOAD_BACK_FILL:g} device pools of filler pass through it")
    limit = pool_limit(infos)
    per = min(LOAD_BACK_PER_REQUEST, int(0.8 * limit)) if limit else LOAD_BACK_PER_REQUEST
    fill = int(LOAD_BACK_FILL * pool)
    requests = -(-fill // max(per, 1))
    if requests > LOAD_BACK_MAX_REQUESTS:
        return None, line("load_back", target, "skip", f"a device pool of {pool} tokens needs {requests} filler "
                          f"prompts of {per} tokens (over {LOAD_BACK_MAX_REQUESTS})")
    return {"pool": pool, "ratio": ratio, "fill": fill, "per": per, "requests": requests}, None


def load_back_filler(model: str, rid: str, tokens: int) -> dict:
    """One filler prompt of the ``load_back`` probe: about ``tokens`` tokens of :data:`FILLER`, led
    by its own ``rid`` so that no two share a cached prefix; one token answered."""
    body = _filler_body(model, rid, int(tokens * FILLER_CHARS_PER_TOKEN))
    body["messages"][0]["content"] = f"Filler {rid}. " + body["messages"][0]["content"]
    body["max_tokens"] = 1
    return body


def judge_load_back(first: C.TurnResult, back: C.TurnResult, target: str, plan: dict, **detail: Any) -> dict:
    """``load_back``: the known-answer request computed (``first``) and asked again after the
    filler evicted it from the device tier (``back``). Fail when ``back``'s calls differ from the
    first (or it got no answer); pass when they are the same and its prefix came from the host tier
    (``sglext.cached_tokens_details.host`` > 0, or cached tokens when the tiers are not reported);
    skip when the first answer has no calls, or the replay did not come from the host tier (the
    filler did not evict it, or the host tier did not keep it)."""
    base = _call_set(first)
    hit = ((back.usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
    tiers = (back.sglext or {}).get("cached_tokens_details")
    host = _int(tiers.get("host")) if isinstance(tiers, dict) else None
    device = _int(tiers.get("device")) if isinstance(tiers, dict) else None
    facts = dict(plan, cached_tokens=hit, host_tokens=host, device_tokens=device, **detail)
    filled = f"after {plan['fill']} filler tokens in {plan['requests']} prompts (device pool {plan['pool']})"
    if not _answered(first) or not base:
        return line("load_back", target, "skip", "the first answer has no tool calls to compare (see tool_call)", **facts)
    got = _call_set(back)
    if not _answered(back) or got != base:
        what = (back.error or f"HTTP {back.http_status}") if not _answered(back) else \
            ", ".join(f"{n}({clip(json.dumps(a, ensure_ascii=False), 60)})" for n, a in got) or "no tool calls"
        src = f"loaded back from the host tier ({host} tokens)" if host else f"asked again {filled}"
        return line("load_back", target, "fail", f"the answer {src} differs from the first computation: {what}; "
                    "first: " + ", ".join(f"{n}({clip(json.dumps(a, ensure_ascii=False), 60)})" for n, a in base),
                    **facts)
    if host == 0 or (host is None and not hit):
        why = (f"its prefix was still in the device tier ({device} tokens)" if device else
               "it was computed afresh (no cached tokens): the host tier did not keep it")
        return line("load_back", target, "skip", f"not loaded back {filled}: {why}", **facts)
    return line("load_back", target, "pass", f"the same {len(base)} call(s) with the prefix loaded back from the "
                f"host tier ({host if host is not None else f'{hit} cached, tier not reported'} tokens) {filled}",
                **facts)


async def flush_workers(http: aiohttp.ClientSession, urls: list[str]) -> Optional[str]:
    """``POST /flush_cache`` on every worker (SGLang 0.5.23: only when idle; resets the radix tree
    and HiCache's state); None when every one answered 200, else why not (one line)."""
    if not urls:
        return "no workers known"
    for u in urls:
        try:
            async with http.post(u + "/flush_cache", timeout=aiohttp.ClientTimeout(total=30)) as r:
                if r.status != 200:
                    text = (await r.content.read(300)).decode("utf-8", "replace")
                    return f"{u}/flush_cache: HTTP {r.status} {clip(' '.join(text.split()), 100)}"
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            return f"{u}/flush_cache: {type(e).__name__}"
    return None


def pool_limit(infos: list[Any]) -> Optional[int]:
    """The smallest ``max_req_input_len`` of the workers' ``/server_info`` (tokens; SGLang 0.5.23
    ``tp_worker.py``: min(context length, KV pool tokens) − 1 − 5, reported by the scheduler), or
    None when no worker reports one. A prompt at or over it is refused by that worker even when
    it fits the context length (``validate_input_length``, an abort: HTTP 400)."""
    known = [n for i in infos if isinstance(i, dict) and (n := _int(i.get("max_req_input_len"))) and n > 0]
    return min(known) if known else None


def over_pool_tokens(limit: Optional[int], context_len: Optional[int], target: str) -> tuple[Optional[int], Optional[dict]]:
    """(prompt tokens to send, None) for the ``over_pool`` probe — a prompt between the KV pool's
    limit and the context length, the band where a PD deployment answered with HTTP 200 and
    garbage (sglang#30233) while every prompt over the context length was refused — or (None,
    skipped line): no limit reported, no context length, a pool that holds a full-context
    request (no band), or a band too narrow for a prompt whose size is known to ±
    :data:`BAND_SLACK`."""
    if limit is None:
        return None, line("over_pool", target, "skip", "no server_info max_req_input_len (the KV pool's limit is unknown)")
    if context_len is None:
        return None, line("over_pool", target, "skip", "no context length known")
    if limit >= context_len - 7:
        return None, line("over_pool", target, "skip",
                          f"the KV pool holds a full-context request (max_req_input_len {limit} tokens, context "
                          f"length {context_len}): no band between them")
    lo, hi = limit / (1 - BAND_SLACK), context_len / (1 + BAND_SLACK)
    if lo >= hi:
        return None, line("over_pool", target, "skip",
                          f"the band {limit}..{context_len} tokens is too narrow for a prompt sized to "
                          f"±{BAND_SLACK:.0%}")
    tokens = int((lo + hi) / 2)
    if tokens > MAX_PROBED_CONTEXT:
        return None, line("over_pool", target, "skip", f"a prompt of {tokens} tokens is over {MAX_PROBED_CONTEXT}")
    return tokens, None


def judge_over_pool(res: C.TurnResult, target: str, limit: int, context_len: int, tokens: int) -> dict:
    """``over_pool``: HTTP 4xx passes (SGLang refuses the prompt: longer than its KV pool);
    HTTP 200 or no answer fails."""
    what = (f"a prompt of about {tokens} tokens, over the KV pool's limit {limit} (server_info max_req_input_len) "
            f"and under the context length {context_len}")
    detail = {"max_req_input_len": limit, "context_length": context_len, "prompt_tokens_sent": tokens,
              "http_status": res.http_status}
    if res.http_status is not None and 400 <= res.http_status < 500:
        return line("over_pool", target, "pass", f"HTTP {res.http_status} for {what}", error=clip(res.error or "", 200),
                    **detail)
    if res.http_status == 200:
        pt = (res.usage or {}).get("prompt_tokens")
        return line("over_pool", target, "fail",
                    f"HTTP 200 for {what}, expected a 4xx (prompt_tokens {_short(pt)}; sglang#30233)",
                    content_excerpt=res.content[:200], **detail)
    return line("over_pool", target, "fail", f"{'no answer' if res.http_status is None else f'HTTP {res.http_status}'} "
                f"for {what}: {clip(res.error or '', 160)}", **detail)


def sent_bytes(body: dict) -> int:
    """Bytes of the compact UTF-8 JSON of ``messages`` plus ``tools`` (when declared): what the
    chat template turns into the prompt."""
    n = len(json.dumps(body["messages"], ensure_ascii=False, separators=(",", ":")).encode())
    if body.get("tools"):
        n += len(json.dumps(body["tools"], ensure_ascii=False, separators=(",", ":")).encode())
    return n


# --- probes: judging (pure) -------------------------------------------------------------------
def _int(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _answered(res: C.TurnResult) -> bool:
    return res.http_status == 200 and not res.error and not res.stalled


def _calls(res: C.TurnResult) -> str:
    return ", ".join(f"{c.name}({clip(c.arguments, 40)})" for c in res.tool_calls)


def judge_tool_choice_none(res: C.TurnResult, target: str, specs: dict[str, C.ToolSpec]) -> dict:
    """``tool_choice_none``: no tool_calls, no DSML / think markup in content."""
    v = C.classify(res, requires_tool=False, tools=specs)
    if not _answered(res):
        return line("tool_choice_none", target, "fail", f"{v.cls}: {v.reason}")
    if v.cls in (C.DSML_IN_CONTENT, C.THINK_IN_CONTENT):
        return line("tool_choice_none", target, "fail",
                    f"{v.cls}: {v.reason} (tool_choice none: DSML is not parsed, sglang #35736)",
                    content_excerpt=res.content[:300])
    if res.tool_calls:
        return line("tool_choice_none", target, "fail",
                    f"{len(res.tool_calls)} tool call(s) with tool_choice none: {_calls(res)}")
    if not v.ok:
        return line("tool_choice_none", target, "fail", f"{v.cls}: {v.reason}")
    return line("tool_choice_none", target, "pass",
                f"no tool_calls, {len(res.content)} chars of content without markup, finish_reason {res.finish_reason}")


def judge_tool_choice_required(res: C.TurnResult, target: str, specs: dict[str, C.ToolSpec]) -> dict:
    """``tool_choice_required``: at least one call, and the classifier finds nothing."""
    v = C.classify(res, requires_tool=True, tools=specs)
    if not v.ok:
        return line("tool_choice_required", target, "fail", f"{v.cls}: {v.reason}")
    return line("tool_choice_required", target, "pass", f"{len(res.tool_calls)} call(s): {_calls(res)}")


def judge_tool_choice_named(res: C.TurnResult, target: str, specs: dict[str, C.ToolSpec], name: str) -> dict:
    """``tool_choice_named``: at least one call, valid, every call names ``name``."""
    v = C.classify(res, requires_tool=True, tools=specs)
    if not v.ok:
        return line("tool_choice_named", target, "fail", f"{v.cls}: {v.reason}")
    choice = {"type": "function", "function": {"name": name}}
    wrong = E.check_turn(None, choice, res.tool_calls)
    if wrong:
        return line("tool_choice_named", target, "fail", f"{E.WRONG_TOOL}: {wrong[E.WRONG_TOOL]}")
    return line("tool_choice_named", target, "pass", f"{len(res.tool_calls)} call(s) of {name}: {_calls(res)}")


def context_length(infos: list[Any], models: Any) -> tuple[Optional[int], str]:
    """(context length in tokens, where it came from): the largest ``context_length`` of the
    workers' ``/server_info`` (a prompt over it is over every worker's), else the entry's
    ``/v1/models`` ``data[0].max_model_len``; (None, why) when neither is a positive integer."""
    known = [n for i in infos if isinstance(i, dict) and (n := _int(i.get("context_length"))) and n > 0]
    if known:
        return max(known), "server_info context_length"
    data = models.get("data") if isinstance(models, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict):
        n = _int(data[0].get("max_model_len"))
        if n and n > 0:
            return n, "/v1/models max_model_len"
    return None, "no context length known (server_info context_length unset, no /v1/models max_model_len)"


def over_length_skip(context_len: Optional[int], source: str, target: str) -> Optional[dict]:
    """The skipped ``over_length`` line when the probe is not sent, else None."""
    if context_len is None:
        return line("over_length", target, "skip", source)
    if context_len > MAX_PROBED_CONTEXT:
        return line("over_length", target, "skip",
                    f"context length {context_len} tokens ({source}) is over {MAX_PROBED_CONTEXT}: "
                    f"the prompt would be over {MAX_PROBED_CONTEXT * CHARS_PER_TOKEN >> 20} MiB")
    return None


def judge_over_length(res: C.TurnResult, target: str, context_len: int, source: str, prompt_chars: int) -> dict:
    """``over_length``: HTTP 4xx passes; HTTP 200 (or anything else) fails."""
    est = prompt_chars // CHARS_PER_TOKEN
    what = f"a prompt of about {est} tokens over the context length {context_len} ({source})"
    detail = {"context_length": context_len, "prompt_chars": prompt_chars, "http_status": res.http_status}
    if res.http_status is not None and 400 <= res.http_status < 500:
        return line("over_length", target, "pass", f"HTTP {res.http_status} for {what}",
                    error=clip(res.error or "", 200), **detail)
    if res.http_status == 200:
        pt = (res.usage or {}).get("prompt_tokens")
        return line("over_length", target, "fail",
                    f"HTTP 200 for {what}, expected a 4xx (prompt_tokens {_short(pt)}, "
                    f"finish_reason {_short(res.finish_reason)!r})", content_excerpt=res.content[:200], **detail)
    if res.http_status is None:
        return line("over_length", target, "fail", f"no answer for {what}: {res.error}", **detail)
    return line("over_length", target, "fail", f"HTTP {res.http_status} for {what}, expected a 4xx: "
                f"{clip(res.error or '', 160)}", **detail)


def judge_prompt_tokens(samples: list[tuple[str, int, C.TurnResult]], target: str) -> dict:
    """``prompt_tokens``: ``samples`` are (probe, bytes sent (:func:`sent_bytes`), result). Probes
    without an answer are left out (their own line failed). Fails on the first answered probe whose
    ``usage.prompt_tokens`` is missing, under 1 per :data:`MIN_BYTES_PER_TOKEN` bytes, or over
    :data:`MAX_TOKENS_PER_BYTE` per byte."""
    seen = []
    for probe, nbytes, res in samples:
        if not _answered(res):
            continue
        pt = _int((res.usage or {}).get("prompt_tokens"))
        seen.append({"probe": probe, "prompt_tokens": pt, "bytes": nbytes})
        if pt is None:
            got = (res.usage or {}).get("prompt_tokens")
            return line("prompt_tokens", target, "fail", f"{probe}: no usage.prompt_tokens"
                        + (f" ({_short(got)!r})" if got is not None else ""), probes=seen)
        if pt * MIN_BYTES_PER_TOKEN < nbytes:
            return line("prompt_tokens", target, "fail",
                        f"{probe}: prompt_tokens {pt} for {nbytes} bytes sent, under 1 token per "
                        f"{MIN_BYTES_PER_TOKEN} bytes (the prompt was not what was sent)", probes=seen)
        if pt > nbytes * MAX_TOKENS_PER_BYTE:
            return line("prompt_tokens", target, "fail",
                        f"{probe}: prompt_tokens {pt} for {nbytes} bytes sent, over 1 token per byte", probes=seen)
    if not seen:
        return line("prompt_tokens", target, "skip", "no completion probe was answered")
    return line("prompt_tokens", target, "pass",
                f"{len(seen)} probe(s) within 1 token per {MIN_BYTES_PER_TOKEN} bytes .. 1 per byte sent ("
                + ", ".join(f"{x['probe']} {x['prompt_tokens']}/{x['bytes']}" for x in seen[:3]) + ")", probes=seen)


def workers_for(entry: str, given: list[Worker], gateway: Optional[dict]) -> list[Worker]:
    """Pure: the workers whose facts smoke reads. ``given`` (the profile's server groups or
    ``--worker`` URLs) when not empty; else the workers a gateway at ``entry`` lists (named
    ``<worker_type> <url>``); else the entry itself (a server checked directly)."""
    if given:
        return given
    if gateway is not None:
        return [Worker(name=f"{w['worker_type']} {w['url']}", url=w["url"]) for w in gateway["workers"]]
    return [Worker(name=entry, url=entry)]


async def probe_gateway(http: aiohttp.ClientSession, entry: str, timeout: float) -> Optional[dict]:
    """:func:`.gateway.identify_gateway` of ``entry`` from ``GET /server_info``, and when that is
    not 200, ``GET /get_server_info`` and ``GET /workers``. None when ``entry`` is a server.
    Raises ConnectError / BadResponse as :func:`.driver.fetch_json`."""
    from .gateway import identify_gateway
    status, _ = await fetch_json(http, entry + "/server_info", timeout=timeout)
    if status == 200:
        return None
    st2, gsi = await fetch_json(http, entry + "/get_server_info", timeout=timeout)
    st3, wdoc = await fetch_json(http, entry + "/workers", timeout=timeout)
    return identify_gateway(status, gsi if st2 == 200 else None, wdoc if st3 == 200 else None)


async def run_smoke(entry: str, workers: list[Worker], *, model: Optional[str] = None,
                    timeout: float = 60.0, api_key: Optional[str] = None,
                    expect_version: Optional[str] = None) -> tuple[list[dict], bool]:
    """All smoke lines and whether the entry URL was reachable at all. ``workers``: whose facts
    (health, server_info) to read; [] = the entry's own, or the workers a gateway at the entry
    lists (:func:`workers_for`). ``api_key``: bearer token. ``timeout``: seconds for each probe's
    complete answer (also the no-progress limit); a body over the size limits of :mod:`.classify`
    fails its line. ``expect_version``: the SGLang release the deployment runs (the release's
    tree version; every worker must report it), None: any supported release
    (:func:`judge_server_info`). The entry is unreachable (returned False; the ``models`` line says
    why) when ``GET /v1/models`` gets no HTTP answer or a broken one. Raises
    :class:`.driver.ClientSideError` for a failure of this machine (out of file descriptors, DNS),
    and :class:`.driver.AuthRefused` (one) when ``/v1/models``, or a completion probe before any
    was taken, is answered HTTP 401 / 403 (the API key is missing or wrong: no verdict on the
    server). A 401 / 403 after a probe was taken fails that probe's line."""
    from .driver import auth_headers
    async with aiohttp.ClientSession(headers=auth_headers(api_key), timeout=aiohttp.ClientTimeout(
            total=None, sock_connect=10, sock_read=timeout)) as http:
        run = SmokeRun(http, entry, timeout, model)
        workers = await run.router(workers)
        await run.health(workers)
        reachable, models_doc = await run.models()
        infos = await run.server_infos(workers, expect_version)
        if not reachable:
            return run.out, False
        await run.completions()
        await run.replay(workers)
        await run.load_back(infos)
        await run.tool_choices()
        await run.over_limits(infos, models_doc)
        run.out.append(judge_prompt_tokens(run.samples, entry))
    return run.out, True


def _or_raise_client_side(e: Exception) -> None:
    """Re-raise a failure of this machine (:class:`.driver.ClientSideError`: the run stops, exit 2);
    other connection errors become the line's reason."""
    if isinstance(e, ClientSideError):
        raise e


class SmokeRun:
    """The I/O of one :func:`run_smoke`: the HTTP session, the entry URL, the lines so far
    (``out``), the answered probes for ``prompt_tokens`` (``samples``) and whether the server has
    taken the API key (``accepted``). Each method appends its lines; the judging is the pure
    ``judge_*`` functions."""

    def __init__(self, http: aiohttp.ClientSession, entry: str, timeout: float, model: Optional[str]):
        self.http, self.entry, self.timeout, self.model = http, entry, timeout, model
        self.url = entry + "/v1/chat/completions"
        self.specs = C.tool_specs(TOOLS)
        self.out: list[dict] = []
        self.samples: list[tuple[str, int, C.TurnResult]] = []
        self.accepted = False

    async def router(self, workers: list[Worker]) -> list[Worker]:
        """The ``router`` line when the entry is a PD gateway (a given worker it does not list
        fails it); returns the workers whose facts are read (:func:`workers_for`)."""
        gateway = None
        if not any(w.url == self.entry for w in workers):
            try:
                gateway = await probe_gateway(self.http, self.entry, self.timeout)
            except (ConnectError, BadResponse) as e:
                _or_raise_client_side(e)
                gateway = None          # the models line says why
        if gateway is not None:
            listed = {w["url"] for w in gateway["workers"]}
            missing = [w.url for w in workers if w.url not in listed]
            bad = bool(gateway["workers"] and missing)
            self.out.append(line("router", self.entry, "fail" if bad else "pass",
                                 f"{gateway['summary']}; not behind it: {', '.join(missing)}" if bad
                                 else gateway["summary"], kind=gateway["kind"], workers=gateway["workers"]))
        workers = workers_for(self.entry, workers, gateway)
        if not workers:
            self.out.append(line("server_info", self.entry, "skip",
                                 "the gateway lists no workers: give --worker URL or --profile"))
        return workers

    async def health(self, workers: list[Worker]) -> None:
        """One ``health`` line per worker: ``GET /health`` answered 200."""
        for w in workers:
            try:
                status, _ = await fetch_json(self.http, w.url + "/health", timeout=self.timeout)
                self.out.append(line("health", w.name, "pass" if status == 200 else "fail",
                                     "200" if status == 200 else f"HTTP {status}", url=w.url))
            except (ConnectError, BadResponse) as e:
                _or_raise_client_side(e)
                self.out.append(line("health", w.name, "fail", str(e), url=w.url))

    async def models(self) -> tuple[bool, Any]:
        """The ``models`` line; (reachable, the ``/v1/models`` document when it was 200, else None).
        The model of the probes becomes the first listed unless one was given."""
        try:
            status, doc = await fetch_json(self.http, self.entry + "/v1/models", timeout=self.timeout)
        except (ConnectError, BadResponse) as e:
            _or_raise_client_side(e)
            self.out.append(line("models", self.entry, "fail", str(e)))
            return not isinstance(e, ConnectError), None
        if status in AUTH_STATUSES:
            raise AuthRefused(status, self.entry + "/v1/models", "GET", key_sent(self.http))
        data = doc.get("data") if isinstance(doc, dict) else None
        ids = [m.get("id") for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)] \
            if isinstance(data, list) else []
        if status == 200 and ids:
            self.out.append(line("models", self.entry, "pass", ", ".join(map(str, ids)), models=ids))
            self.model = self.model or ids[0]
        else:
            self.out.append(line("models", self.entry, "fail", f"HTTP {status}, no model listed"))
        return True, doc if status == 200 else None

    async def server_infos(self, workers: list[Worker], expect_version: Optional[str]) -> list[Any]:
        """One ``server_info`` line per worker (``/server_info``, else ``/get_server_info``;
        :func:`judge_server_info`); returns the documents read."""
        infos: list[Any] = []
        for w in workers:
            try:
                info = None
                for path in ("/server_info", "/get_server_info"):
                    status, doc = await fetch_json(self.http, w.url + path, timeout=self.timeout)
                    if status == 200:
                        info = doc
                        break
                if info is None:
                    self.out.append(line("server_info", w.name, "skip", f"no /server_info (HTTP {status})"))
                else:
                    infos.append(info)
                    self.out.append(judge_server_info(info, w, expect_version))
            except (ConnectError, BadResponse) as e:
                _or_raise_client_side(e)
                self.out.append(line("server_info", w.name, "fail", str(e)))
        return infos

    async def probe(self, body: dict, stream: bool, sample: Optional[str] = None) -> tuple[C.TurnResult, dict]:
        """Send one completion probe (kept for ``prompt_tokens`` as ``sample`` when named). A 401 /
        403 before any probe was taken raises AuthRefused: the client's key is wrong (no verdict)."""
        res, timing = await run_turn(self.http, self.url, body, stream, self.timeout)
        if res.http_status in AUTH_STATUSES and not self.accepted:
            raise AuthRefused(res.http_status, self.url, "POST", key_sent(self.http))
        self.accepted = self.accepted or res.http_status is not None
        if sample is not None:
            self.samples.append((sample, sent_bytes(body), res))
        return res, timing

    async def completions(self) -> None:
        """``chat`` (one plain completion, English asked: an answer in another script is drift),
        ``tool_call`` and ``tool_call_stream`` (one known-answer tool turn, JSON and SSE)."""
        self.model = model = self.model or "default"
        body = chat_body(model, _rid())
        res, timing = await self.probe(body, False, "chat")
        v = C.classify(res, requires_tool=False, tools=self.specs, expected_script="Latin")
        self.out.append(line("chat", self.entry, "pass" if v.ok else "fail",
                             f"{res.finish_reason}, {len(res.content)} chars, {timing['e2e_s']:.2f} s" if v.ok else
                             f"{v.cls}: {v.reason}", rid=body["rid"]))
        for name, stream in (("tool_call", False), ("tool_call_stream", True)):
            s = Session(sid=0, turns=2, stream=stream, known_share=1.0, probe_share=0.0)
            rid = _rid()
            body = s.request(model, rid)
            if stream:
                body["stream_options"] = {"include_usage": True}
            res, _ = await self.probe(body, stream, name)
            spec = s.spec()         # a known answer: the calls the instruction states
            v = E.judge(res, requires_tool=True, tools=self.specs, expected=spec.expected_calls,
                        tool_choice=spec.tool_choice, output_path=self.seen_path())
            self.out.append(judge_tool_call(name, res, v, self.entry, rid))

    def seen_path(self) -> Optional[str]:
        """The output path of the release the workers reported in ``server_info`` when they all
        report one (known answers are judged by it: :func:`.expect.compare_calls`), else None."""
        paths = {x["detail"].get("output_path") for x in self.out if x["check"] == "server_info"}
        return paths.pop() if len(paths) == 1 else None

    async def replay(self, workers: list[Worker]) -> None:
        """``replay``: one known-answer request computed, again with its prompt in the prefix cache
        (the GPU radix cache, or HiCache's host tier restoring it), then after ``/flush_cache`` on
        every worker (computed afresh): the calls must be the same each time."""
        s = Session(sid=1, turns=2, stream=False, known_share=1.0, probe_share=0.0)
        first = s.request(self.model, _rid())
        r1, _ = await self.probe(first, False)
        r2, _ = await self.probe(dict(first, rid=_rid()), False)
        flush_why = await flush_workers(self.http, [w.url for w in workers])
        r3 = (await self.probe(dict(first, rid=_rid()), False))[0] if flush_why is None else None
        self.out.append(judge_replay(r1, r2, r3, self.entry, flush_why, rid=first["rid"]))

    async def load_back(self, infos: list[Any]) -> None:
        """``load_back`` (where HiCache runs, :func:`load_back_plan`): the known-answer request,
        filler prompts that evict it from the device tier (:data:`LOAD_BACK_CONCURRENCY` at a
        time), the request again with ``return_cached_tokens_details``: :func:`judge_load_back`."""
        plan, skipped = load_back_plan(infos, self.entry)
        if plan is None:
            if skipped is not None:
                self.out.append(skipped)
            return
        s = Session(sid=2, turns=2, stream=False, known_share=1.0, probe_share=0.0)
        first = dict(s.request(self.model, _rid()), return_cached_tokens_details=True)
        r1, _ = await self.probe(first, False)
        gate = asyncio.Semaphore(LOAD_BACK_CONCURRENCY)

        async def fill(k: int) -> None:
            async with gate:
                await run_turn(self.http, self.url, load_back_filler(self.model, _rid(), plan["per"]), False,
                               self.timeout)
        await asyncio.gather(*(fill(k) for k in range(plan["requests"])))
        r2, _ = await self.probe(dict(first, rid=_rid()), False)
        self.out.append(judge_load_back(r1, r2, self.entry, plan, rid=first["rid"]))

    async def tool_choices(self) -> None:
        """``tool_choice_none``, ``tool_choice_required``, ``tool_choice_named``."""
        for kind in ("none", "required", "named"):
            body = tool_choice_body(kind, self.model, _rid())
            res, _ = await self.probe(body, False, f"tool_choice_{kind}")
            if kind == "none":
                ln = judge_tool_choice_none(res, self.entry, self.specs)
            elif kind == "required":
                ln = judge_tool_choice_required(res, self.entry, self.specs)
            else:
                ln = judge_tool_choice_named(res, self.entry, self.specs, NAMED_PROBE_TOOL)
            ln["detail"]["rid"] = body["rid"]
            self.out.append(ln)

    async def over_limits(self, infos: list[Any], models_doc: Any) -> None:
        """``over_length`` (over the context length) and ``over_pool`` (between the KV pool's limit
        and the context length): each prompt must get a 4xx, or the line says why it was skipped."""
        ctx, source = context_length(infos, models_doc)
        skipped = over_length_skip(ctx, source, self.entry)
        if skipped is not None:
            self.out.append(skipped)
        else:
            body = over_length_body(self.model, _rid(), ctx)
            res, _ = await self.probe(body, False)
            ln = judge_over_length(res, self.entry, ctx, source, len(body["messages"][0]["content"]))
            ln["detail"]["rid"] = body["rid"]
            self.out.append(ln)
        limit = pool_limit(infos)
        tokens, skipped = over_pool_tokens(limit, ctx, self.entry)
        if skipped is not None:
            self.out.append(skipped)
        else:
            body = over_pool_body(self.model, _rid(), tokens)
            res, _ = await self.probe(body, False)
            ln = judge_over_pool(res, self.entry, limit, ctx, tokens)
            ln["detail"]["rid"] = body["rid"]
            self.out.append(ln)


def judge_tool_call(name: str, res: C.TurnResult, v: C.Verdict, target: str, rid: str) -> dict:
    """``tool_call`` / ``tool_call_stream``: the known-answer verdict ``v`` is ok and
    ``finish_reason`` is ``tool_calls``."""
    ok = v.ok and res.finish_reason == "tool_calls"
    reason = (f"{res.tool_calls[0].name}({clip(res.tool_calls[0].arguments, 60)}), finish_reason tool_calls"
              if ok else (f"{v.cls}: {v.reason}" if not v.ok else
                          f"finish_reason {res.finish_reason!r}, expected 'tool_calls'"))
    return line(name, target, "pass" if ok else "fail", reason, rid=rid)
