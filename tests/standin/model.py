"""The STAND-IN's scripted "model": raw DeepSeek-V4 output text for a chat request (pure, no I/O).

It writes what DeepSeek-V4 writes — prose, an optional reasoning block closed by ``</think>``, and
DSML tool-call blocks (``<｜DSML｜tool_calls>`` / ``invoke`` / ``parameter``, the spelling of
SGLang 0.5.23 ``srt/function_call/deepseekv4_detector.py``) — as :class:`~tests.standin.served.Seg`
runs that :mod:`tests.standin.served` turns into token IDs and parses with SGLang's real output
path. It follows the conversation's last instruction:

* ``Call T with exactly these arguments: {json}.`` (and ``Also call T …``): a known answer, called
  exactly (dsv4ctl's known-answer workload, :mod:`dsv4ctl.check.workload`);
* ``call the T tool``: T with schema-valid example arguments;
* ``answer in about N words``: N words of varied prose (no repeated 8-gram);
* anything else: a short sentence.

``tool_choice`` is honoured as SGLang's grammar enforces it (``required`` / named: a call;
``none``: the prompt renders without tools, so a healthy model answers in prose).

Corruption (the HiCache incident and the shapes of issue 14) is injected into this *text*, never
into the parsed output: :data:`KINDS` lists every kind with what a client then sees.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any, Optional

from .served import Seg

BAR = "\uff5c"
DSML = f"{BAR}DSML{BAR}"
BLOCK_OPEN = f"<{DSML}tool_calls>"
BLOCK_CLOSE = f"</{DSML}tool_calls>"
INVOKE_CLOSE = f"</{DSML}invoke>"
PARAM_CLOSE = f"</{DSML}parameter>"
THINK_END = "</think>"
EOS = f"<{BAR}end\u2581of\u2581sentence{BAR}>"

DIRECTIVE_RE = re.compile(r"(?:Call|Also call) (\w+) with exactly these arguments: ")
CALL_RE = re.compile(r"call the (\w+) tool")
ANSWER_RE = re.compile(r"answer in about (\d+) words")

SCRIPT_FIELD = "standin_output"
"""Request field (stand-in only, SGLang has none): the exact raw model text to serve, for the DSML
corpus test (SGLang's own detector test texts through the served path)."""

KINDS: dict[str, str] = {
    # kind: what the client sees through SGLang 0.5.23's served path
    "markup_as_text": "the DSML block sampled as ordinary tokens: markup in content, no tool_calls",
    "think_leak": "'</think>' sampled as ordinary tokens: the tag in content",
    "bad_json_value": "a string=\"false\" parameter whose value is not JSON: arguments not JSON",
    "json_body_invoke": "a JSON body inside invoke: arguments {}",
    "truncated": "the output stops mid-call at the token cap: finish_reason length",
    "wrong_args": "one argument value changed (a line number off by one, a path cut): valid JSON, wrong answer",
    "dropped_block": "each call in its own tool_calls block: SGLang keeps the first block only",
    "other_bars": "the DSML block spelled with U+2016 bars (‖DSML‖): markup in content",
    "ascii_bars": "the DSML block spelled with ASCII bars (|DSML|): markup in content",
    "special_token": "'<｜end▁of▁sentence｜>' in the middle of the answer",
    "dsml_in_reasoning": "a DSML block written as text inside the reasoning (thinking requests)",
    "markup_in_args": "DSML text inside a string argument",
    "extra_call": "one more call than asked for",
    "wrong_tool": "a different declared tool than asked for",
    "loop": "the answer repeats one sentence until the end",
    "language_switch": "the English answer continues in Chinese",
    "language_mix": "single Chinese and Russian words scattered through the English answer",
    "language_drift": "the whole answer in Chinese although the prompt is English (naming `kv_cache` and torch.cuda)",
    "empty_length": "reasoning until the token cap, no answer (thinking requests)",
    "call_when_none": "a DSML block although tool_choice is none: the parser is off, markup in content",
    "no_call": "prose instead of the call the turn asks for: no tool_calls",
    "quoted_markup": "CLEAN: prose that quotes DSML inside a code span (not corruption)",
    "closer_in_args": "a here-document in a string argument quotes '</｜DSML｜parameter |': the parser ends the string there",
    "quoted_cut": "prose that quotes one DSML tag in ordinary quotes: the parser cuts the content at it (an open quote)",
}

INCIDENT_KINDS = ("markup_as_text", "think_leak", "bad_json_value", "json_body_invoke", "truncated",
                  "wrong_args", "dropped_block", "other_bars", "special_token")
INCIDENT_WEIGHTS = (0.52, 0.08, 0.08, 0.06, 0.06, 0.08, 0.04, 0.04, 0.04)
"""Kinds drawn for a turn the HiCache race corrupts (mostly markup as text, as in the incident)."""

WORDS = ("scheduler", "request", "prefix", "cache", "handler", "route", "batch", "tokens", "latency",
         "decode", "prefill", "worker", "queue", "page", "pool", "rank", "layer", "buffer", "kernel",
         "stream", "lock", "timeout", "retry", "config", "path", "module", "test", "branch", "commit",
         "index", "memory", "budget", "slot", "window", "tensor", "graph", "capture", "warmup", "metric",
         "counter", "log", "trace", "sample", "thread", "signal", "socket", "packet", "header", "field")
VERBS = ("reads", "writes", "holds", "drops", "moves", "checks", "keeps", "frees", "sends", "waits for",
         "splits", "merges", "sorts", "tracks", "limits", "updates", "returns", "loads", "stores", "skips")
ADJ = ("the", "each", "one", "a shared", "the next", "every", "this", "that", "the old", "a new")


@dataclass
class Output:
    """What the model wrote: ``segs`` (token runs), the corruption ``kind`` or None, and
    ``cap`` — a token count the output stops at with finish_reason length (None: ends normally)."""

    segs: list[Seg]
    kind: Optional[str] = None
    cap: Optional[int] = None


def directives(text: str) -> list[tuple[str, dict]]:
    """Known-answer calls stated in ``text``: ``[(tool, arguments)]`` in order (arguments that are
    not a JSON object end the list)."""
    out = []
    dec = json.JSONDecoder()
    for m in DIRECTIVE_RE.finditer(text):
        try:
            args, _ = dec.raw_decode(text, m.end())
        except ValueError:
            break
        if not isinstance(args, dict):
            break
        out.append((m.group(1), args))
    return out


def example_value(name: str, schema: dict) -> Any:
    """A value that satisfies ``schema`` (enum → first, integer → max(7, minimum), string → text)."""
    if "enum" in schema:
        return schema["enum"][0]
    t = schema.get("type")
    if t == "integer":
        return max(7, schema.get("minimum", 0))
    if t == "number":
        return 1.5
    if t == "boolean":
        return True
    if t == "array":
        return []
    if t == "object":
        return {}
    return f'src/{name}/"main".py\nline 2' if name in ("path", "command") else f"{name} value"


def example_args(parameters: Optional[dict]) -> dict:
    """Schema-valid arguments for a tool's ``parameters`` (every declared property)."""
    props = (parameters or {}).get("properties") or {}
    return {p: example_value(p, s) for p, s in props.items()}


def prose(rng: random.Random, words: int) -> str:
    """About ``words`` words of English sentences from a 49-noun, 20-verb vocabulary (no 8-gram
    repeats in practice: each sentence draws its words independently)."""
    out: list[str] = []
    while len(out) < words:
        n = rng.choice(WORDS)
        s = [rng.choice(ADJ).capitalize(), n, rng.choice(VERBS), rng.choice(ADJ), rng.choice(WORDS)]
        if rng.random() < 0.5:
            s += ["before", rng.choice(ADJ), rng.choice(WORDS), rng.choice(VERBS), rng.choice(WORDS)]
        out += " ".join(s).split()
        out[-1] += "."
    return " ".join(out[:words]).rstrip(".") + "."


def _param(name: str, value: Any) -> str:
    is_str = isinstance(value, str)
    text = value if is_str else json.dumps(value, ensure_ascii=False)
    return f'<{DSML}parameter name="{name}" string="{"true" if is_str else "false"}">{text}{PARAM_CLOSE}\n'


def block_text(calls: list[tuple[str, dict]], dsml: str = DSML) -> str:
    """One ``tool_calls`` block calling ``calls`` in order (a call without arguments has no
    parameter tags). ``dsml`` replaces the ``｜DSML｜`` spelling (other-bar leaks)."""
    out = [f"<{DSML}tool_calls>\n"]
    for name, args in calls:
        out.append(f'<{DSML}invoke name="{name}">\n')
        out += [_param(k, v) for k, v in args.items()]
        out.append(f"{INVOKE_CLOSE}\n")
    out.append(BLOCK_CLOSE)
    text = "".join(out)
    return text if dsml == DSML else text.replace(DSML, dsml)


def _wrong(args: dict) -> dict:
    """``args`` with one value changed the way a corrupted KV read changes it: the first integer
    off by one, else the first string cut to its first half, else an extra key."""
    out = dict(args)
    for k, v in out.items():
        if isinstance(v, int) and not isinstance(v, bool):
            out[k] = v + 1
            return out
    for k, v in out.items():
        if isinstance(v, str) and len(v) > 1:
            out[k] = v[: len(v) // 2]
            return out
    out["retries"] = 3
    return out


def _last_text(body: dict) -> str:
    last = body["messages"][-1]
    text = last.get("content") if isinstance(last, dict) else ""
    if isinstance(text, list):
        text = " ".join(p.get("text", "") for p in text if isinstance(p, dict))
    return text if isinstance(text, str) else ""


def tool_choice_name(body: dict) -> Optional[str]:
    """The tool a named ``tool_choice`` forces, else None."""
    tc = body.get("tool_choice")
    if isinstance(tc, dict):
        fn = tc.get("function") or {}
        return fn.get("name") if isinstance(fn.get("name"), str) else None
    return None


def write(body: dict, rng: random.Random, kind: Optional[str] = None, *, thinking: bool = False) -> Output:
    """The model output for ``body`` (an OpenAI chat request), corrupted by ``kind`` (a key of
    :data:`KINDS`) when given; a kind that cannot apply to this turn falls back to
    ``markup_as_text`` (or is ignored for clean kinds)."""
    if isinstance(body.get(SCRIPT_FIELD), str):
        return Output([Seg(body[SCRIPT_FIELD])])
    tools = {t.get("function", {}).get("name"): t.get("function", {}).get("parameters")
             for t in body.get("tools") or () if isinstance(t, dict)}
    choice = body.get("tool_choice", "auto")
    text = _last_text(body)
    calls = directives(text)
    if not calls:
        m = CALL_RE.search(text)
        if m:
            calls = [(m.group(1), example_args(tools.get(m.group(1))))]
    forced = tool_choice_name(body)
    if forced:
        calls = [c for c in calls if c[0] == forced][:1] or [(forced, example_args(tools.get(forced)))]
    elif choice == "required" and not calls and tools:
        name = next(iter(tools))
        calls = [(name, example_args(tools[name]))]
    if choice == "none" or not tools:
        if kind == "call_when_none" and calls:
            pass                      # the #35736 shape: the model calls although the prompt had no tools
        else:
            calls = []
    segs: list[Seg] = []
    if thinking:
        reasoning = "The user wants " + (f"the {calls[0][0]} tool." if calls else "an answer.") + " " + prose(rng, 24)
        if kind == "empty_length":
            return Output([Seg(reasoning + " " + prose(rng, 4000))], kind, cap=int(body.get("max_tokens") or 512))
        if kind == "dsml_in_reasoning":
            reasoning += "\n\n" + block_text(calls or [("read_file", {"path": "a.py"})])
            segs.append(Seg(reasoning, plain=True))
            segs.append(Seg(THINK_END))
        else:
            segs.append(Seg(reasoning + THINK_END))
    if calls:
        return _calls(segs, calls, tools, rng, kind, known=bool(directives(text)))
    m = ANSWER_RE.search(text)
    words = int(m.group(1)) if m else 0
    answer = prose(rng, words) if words else "OK, done."
    if kind == "markup_as_text" or (kind in ("other_bars", "ascii_bars", "call_when_none") and not calls):
        dsml = {"other_bars": "\u2016DSML\u2016", "ascii_bars": "|DSML|"}.get(kind or "", DSML)
        return Output(segs + [Seg(answer), Seg("\n\n" + block_text([("list_open_files", {})], dsml), plain=True)], kind)
    if kind == "think_leak":
        half = len(answer) // 2
        return Output(segs + [Seg(answer[:half] + " "), Seg(THINK_END, plain=True), Seg(" " + answer[half:])], kind)
    if kind == "special_token":
        half = len(answer) // 2
        return Output(segs + [Seg(answer[:half] + " " + EOS + " " + answer[half:])], kind)
    if kind == "loop":
        return Output(segs + [Seg(answer + (" The scheduler holds the next request before the queue drains." * 40))], kind)
    if kind == "language_drift":
        return Output(segs + [Seg("负载均衡器把请求分给两台推理服务器，`kv_cache` 和 torch.cuda 的显存由各自的服务器管理，"
                                  "这样每台服务器的队列都不会太长。")], kind)
    if kind == "language_switch":
        return Output(segs + [Seg(answer + " 然后调度器把请求放回队列，缓存页面在下一批次中被重新加载，这样延迟会降低很多。")], kind)
    if kind == "language_mix":
        words = answer.split(" ")
        for at, w in ((len(words) // 4, "请求"), (len(words) // 2, "также"), (3 * len(words) // 4, "缓存")):
            words[at] = words[at] + " " + w
        return Output(segs + [Seg(" ".join(words) + " The scheduler then admits the next batch.")], kind)
    if kind == "quoted_cut":
        return Output(segs + [Seg(answer + f" The block opens with '<{DSML}toolcalls>'.")], kind)
    if kind == "quoted_markup":
        return Output(segs + [Seg(answer + f" The parser looks for `<{DSML}invoke name=\"x\">` and a literal `</think>`.",
                                  plain=True)], kind)
    if kind in (None, "quoted_markup", "empty_length", "dsml_in_reasoning"):
        return Output(segs + [Seg(answer)], None)
    return Output(segs + [Seg(answer), Seg("\n\n" + block_text([("list_open_files", {})]), plain=True)],
                  "markup_as_text")      # a call-only kind on an answer turn: the incident's shape


def _calls(segs: list[Seg], calls: list[tuple[str, dict]], tools: dict, rng: random.Random,
           kind: Optional[str], known: bool) -> Output:
    """A call turn: a short lead-in, then the block, corrupted by ``kind``. ``known``: the calls
    were stated in the prompt (a changed value is visible only then; otherwise ``wrong_args``
    falls back to markup as text)."""
    lead = Seg("I will look at that.\n\n")
    if kind == "no_call":
        return Output(segs + [Seg("I looked at it already; nothing more to call.")], kind)
    if kind == "markup_as_text" or kind in ("other_bars", "ascii_bars"):
        dsml = {"other_bars": "\u2016DSML\u2016", "ascii_bars": "|DSML|"}.get(kind, DSML)
        return Output(segs + [lead, Seg(block_text(calls, dsml), plain=True)], kind)
    if kind == "call_when_none":
        return Output(segs + [lead, Seg(block_text(calls))], kind)
    if kind == "think_leak":
        return Output(segs + [Seg("I will look "), Seg(THINK_END, plain=True), Seg(" at that.\n\n"),
                              Seg(block_text(calls))], kind)
    if kind == "wrong_args" and known:
        return Output(segs + [lead, Seg(block_text([(calls[0][0], _wrong(calls[0][1]))] + calls[1:]))], kind)
    if kind == "dropped_block" and len(calls) > 1:
        return Output(segs + [lead, Seg(block_text(calls[:1]) + "\n\n" + block_text(calls[1:]))], kind)
    if kind == "extra_call":
        return Output(segs + [lead, Seg(block_text(calls + [("list_open_files", {})]))], kind)
    if kind == "wrong_tool":
        other = next((n for n in tools if n != calls[0][0]), None)
        if other:
            return Output(segs + [lead, Seg(block_text([(other, example_args(tools[other]))] + calls[1:]))], kind)
    if kind == "markup_in_args":
        name, args = calls[0]
        key = next((k for k, v in args.items() if isinstance(v, str)), None)
        if key:
            head = block_text([(name, {**args, key: "\u0000"})]).split("\u0000")
            return Output(segs + [lead, Seg(head[0]), Seg(args[key] + f" <{DSML}invoke name=\"x\">", plain=True),
                                  Seg(head[1])], kind)
    if kind == "closer_in_args":
        name, args = calls[0]
        key = next((k for k, v in args.items() if isinstance(v, str)), None)
        if key:
            head = block_text([(name, {**args, key: "\u0000"})]).split("\u0000")
            doc = f"{args[key]}\ncat <<'EOF'\n</{DSML}parameter |\nEOF"
            return Output(segs + [lead, Seg(head[0] + doc + head[1])], kind)
    if kind == "json_body_invoke" and any(a for _, a in calls):
        name, args = next((c for c in calls if c[1]), calls[0])
        body = f'<{DSML}tool_calls>\n<{DSML}invoke name="{name}">\n{json.dumps(args)}\n{INVOKE_CLOSE}\n{BLOCK_CLOSE}'
        return Output(segs + [lead, Seg(body)], kind)
    if kind == "bad_json_value":
        name, args = calls[0]
        text = block_text([(name, args)])
        bad = f'<{DSML}parameter name="retries" string="false">a few{PARAM_CLOSE}\n{INVOKE_CLOSE}'
        return Output(segs + [lead, Seg(text.replace(INVOKE_CLOSE, bad, 1))], kind)
    if kind == "truncated":
        out = segs + [lead, Seg(block_text(calls))]
        return Output(out, kind, cap=-1)          # the server caps just before the first parameter closer
    if kind == "special_token":
        return Output(segs + [Seg("I will look " + EOS + " at that.\n\n"), Seg(block_text(calls))], kind)
    if kind == "quoted_cut":
        return Output(segs + [Seg(f"The block opens with '<{DSML}toolcalls>'.\n"), Seg(block_text(calls))], kind)
    if kind in (None, "quoted_markup", "loop", "language_switch", "language_mix", "empty_length", "dsml_in_reasoning"):
        return Output(segs + [lead, Seg(block_text(calls))], None)
    return Output(segs + [lead, Seg(block_text(calls), plain=True)], "markup_as_text")


def incident_kind(rng: random.Random) -> str:
    """A kind for a turn the HiCache race corrupted (weights :data:`INCIDENT_WEIGHTS`)."""
    return rng.choices(INCIDENT_KINDS, INCIDENT_WEIGHTS)[0]
