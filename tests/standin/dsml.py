"""Stand-in "model" output and the DeepSeek-V4 DSML output parser (pure, no I/O).

The fake model writes token lists. DSML tags are *special tokens* (one token per tag), which is
how deepseek-recipe's StreamProcessor recognises them ("``</think>`` and the DSML tags are
recognized by token ID", SGLang 0.5.23 ``srt/parser/deepseek_recipe_output.py``). The parser
below mirrors the client-visible behaviour of that path as documented in the reference
(``sglang-0.5.23-ops.md`` §5.3-5.4, verified there with deepseek-recipe 0.2.0):

* prose before the block → ``content`` with the trailing ``\\n\\n`` removed;
* per invoke: a first piece with ``name`` and ``arguments: ""``, then argument fragments;
  arguments ``{"p": v, ...}`` in DSML order, ``string="true"`` values JSON-escaped,
  ``string="false"`` values copied verbatim (so a non-JSON value gives unparseable arguments);
* a JSON body inside ``invoke`` (no ``parameter`` tags) and a self-closing invoke → ``"{}"``;
* a missing ``</｜DSML｜tool_calls>`` closer is fine; text after the block is dropped;
* when tool parsing is off (no tools, ``tool_choice: "none"``, no ``--tool-call-parser``) every
  token is content, markup included.

The corruption the incident shows (markup in ``content``) is produced by the model writing the
DSML characters as ordinary text tokens, split in small pieces, which the parser cannot
recognise — so the streaming client sees the markup cut across SSE chunks.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from typing import Optional

BAR = "\uff5c"
BLOCK_OPEN = f"<{BAR}DSML{BAR}tool_calls>"
BLOCK_CLOSE = f"</{BAR}DSML{BAR}tool_calls>"
INVOKE_CLOSE = f"</{BAR}DSML{BAR}invoke>"
PARAM_CLOSE = f"</{BAR}DSML{BAR}parameter>"
_INVOKE_RE = re.compile(rf'^<{BAR}DSML{BAR}invoke name="([^"]*)"(/?)>$')
_PARAM_RE = re.compile(rf'^<{BAR}DSML{BAR}parameter name="([^"]*)" string="(true|false)">$')


def invoke_open(name: str, self_closing: bool = False) -> str:
    return f'<{BAR}DSML{BAR}invoke name="{name}"{"/" if self_closing else ""}>'


def param_open(name: str, string: bool) -> str:
    return f'<{BAR}DSML{BAR}parameter name="{name}" string="{"true" if string else "false"}">'


@dataclass(frozen=True)
class Tok:
    """One generated token: ``special`` tokens are recognised by the parser by identity."""

    text: str
    special: bool = False


@dataclass
class Delta:
    """What one parser step yields: content text and tool-call pieces ``(index, name|None, args)``."""

    content: str = ""
    calls: list[tuple[int, Optional[str], str]] = field(default_factory=list)


def text_tokens(text: str, size: int = 4) -> list[Tok]:
    """Ordinary text cut into ``size``-character tokens."""
    return [Tok(text[i:i + size]) for i in range(0, len(text), size)]


class DSMLParser:
    """Streaming DSML parser (see module docstring). ``feed`` one token at a time; ``calls``
    counts emitted tool calls; ``finished`` after the block closer."""

    def __init__(self, parse_tool_calls: bool):
        self.parse = parse_tool_calls
        self.state = "text"          # text | block | invoke | param | done
        self.calls = 0
        self._held_ws = ""          # trailing whitespace of prose, dropped if a block follows
        self._nparams = 0
        self._string = False

    @property
    def finished(self) -> bool:
        return self.state == "done"

    def feed(self, tok: Tok) -> Delta:
        d = Delta()
        if not self.parse:
            d.content = tok.text
            return d
        s = self.state
        if s == "done":
            return d
        if s == "text":
            if tok.special and tok.text == BLOCK_OPEN:
                self._held_ws = ""
                self.state = "block"
                return d
            text = self._held_ws + tok.text
            stripped = text.rstrip("\n")
            self._held_ws = text[len(stripped):]
            d.content = stripped
            return d
        idx = self.calls - 1
        if s == "block":
            m = _INVOKE_RE.match(tok.text) if tok.special else None
            if m:
                self.calls += 1
                d.calls.append((self.calls - 1, m.group(1), ""))
                if m.group(2):
                    d.calls.append((self.calls - 1, None, "{}"))
                else:
                    self.state, self._nparams = "invoke", 0
            elif tok.special and tok.text == BLOCK_CLOSE:
                self.state = "done"
            return d
        if s == "invoke":
            m = _PARAM_RE.match(tok.text) if tok.special else None
            if m:
                self._string = m.group(2) == "true"
                head = ("{" if self._nparams == 0 else ", ") + json.dumps(m.group(1)) + ": "
                d.calls.append((idx, None, head + ('"' if self._string else "")))
                self._nparams += 1
                self.state = "param"
            elif tok.special and tok.text == INVOKE_CLOSE:
                d.calls.append((idx, None, "}" if self._nparams else "{}"))
                self.state = "block"
            elif tok.special and tok.text == BLOCK_CLOSE:
                d.calls.append((idx, None, "}" if self._nparams else "{}"))
                self.state = "done"
            # anything else inside an invoke (a JSON body) is ignored: arguments are lost
            return d
        if s == "param":
            if tok.special and tok.text == PARAM_CLOSE:
                if self._string:
                    d.calls.append((idx, None, '"'))
                self.state = "invoke"
            else:
                d.calls.append((idx, None, json.dumps(tok.text)[1:-1] if self._string else tok.text))
            return d
        return d

    def flush(self) -> Delta:
        """End of output: held whitespace is content if no block followed."""
        d = Delta()
        if self.state == "text" and self._held_ws:
            d.content, self._held_ws = self._held_ws, ""
        return d


def parse_all(tokens: list[Tok], parse_tool_calls: bool) -> tuple[str, list[dict]]:
    """Whole-output parse: (content, [{index, name, arguments}])."""
    p = DSMLParser(parse_tool_calls)
    content: list[str] = []
    calls: dict[int, dict] = {}
    for t in tokens:
        d = p.feed(t)
        content.append(d.content)
        for i, name, a in d.calls:
            if name is not None:
                calls[i] = {"index": i, "name": name, "arguments": a}
            else:
                calls[i]["arguments"] += a
    content.append(p.flush().content)
    return "".join(content), [calls[i] for i in sorted(calls)]


# --- the fake model ---------------------------------------------------------------------------
CALL_RE = re.compile(r"call the (\w+) tool")
ANSWER_RE = re.compile(r"answer in about (\d+) words")
CORRUPTIONS = ("markup_as_text", "think_leak", "bad_json_value", "json_body_invoke", "truncated")
CORRUPTION_WEIGHTS = (0.6, 0.1, 0.1, 0.1, 0.1)


def example_value(name: str, schema: dict):
    """A value that satisfies ``schema`` (enum → first, integer → 7, string → a path-like text)."""
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


def call_tokens(name: str, parameters: dict, kind: Optional[str] = None) -> list[Tok]:
    """The DSML block calling ``name`` with schema-valid arguments; ``kind`` corrupts it."""
    props = (parameters or {}).get("properties") or {}
    if kind == "markup_as_text":
        return text_tokens("\n\n" + "".join(t.text for t in call_tokens(name, parameters)), size=3)
    toks = [Tok("I will look at that.") if kind != "think_leak" else Tok("I will look </think> at that."),
            Tok("\n\n"), Tok(BLOCK_OPEN, True), Tok("\n")]
    if not props:
        return toks + [Tok(invoke_open(name, self_closing=True), True), Tok("\n"), Tok(BLOCK_CLOSE, True)]
    toks += [Tok(invoke_open(name), True), Tok("\n")]
    if kind == "json_body_invoke":
        body = {p: example_value(p, s) for p, s in props.items()}
        toks += text_tokens(json.dumps(body))
    else:
        bad_done = False
        for p, s in props.items():
            v = example_value(p, s)
            is_str = isinstance(v, str)
            if kind == "bad_json_value" and not is_str and not bad_done:
                text, bad_done = "seven or so", True
            else:
                text = v if is_str else json.dumps(v)
            toks += [Tok(param_open(p, is_str), True), *text_tokens(text), Tok(PARAM_CLOSE, True), Tok("\n")]
        if kind == "bad_json_value" and not bad_done:   # no non-string parameter: break the JSON anyway
            toks += [Tok(param_open("retries", False), True), Tok("a few"), Tok(PARAM_CLOSE, True)]
    toks += [Tok(INVOKE_CLOSE, True), Tok("\n"), Tok(BLOCK_CLOSE, True)]
    if kind == "truncated":
        cut = next(i for i, t in enumerate(toks) if t.text == PARAM_CLOSE) - 1
        return toks[:max(cut, 1)]
    return toks


def answer_tokens(words: int, kind: Optional[str] = None) -> list[Tok]:
    """A prose answer of ``words`` words; ``think_leak`` puts ``</think>`` in it and
    ``markup_as_text`` appends a DSML block written as plain text."""
    vocab = ["the", "scheduler", "request", "prefix", "cache", "handler", "route", "batch", "tokens", "latency"]
    text = " ".join(vocab[i % len(vocab)] for i in range(words)) + "."
    if kind == "think_leak":
        text = text[: len(text) // 2] + " </think> " + text[len(text) // 2:]
    toks = text_tokens(text)
    if kind == "markup_as_text":
        toks += text_tokens("\n\n" + BLOCK_OPEN + "\n" + invoke_open("list_open_files", True) + "\n" + BLOCK_CLOSE, 3)
    return toks


def corruption_kind(rng: random.Random, tool_parameters: Optional[dict], tool_turn: bool) -> str:
    """Pick a corruption; kinds that cannot corrupt this turn fall back to ``markup_as_text``."""
    kind = rng.choices(CORRUPTIONS, CORRUPTION_WEIGHTS)[0]
    if not tool_turn and kind not in ("markup_as_text", "think_leak"):
        return "markup_as_text"
    if tool_turn and kind in ("json_body_invoke", "truncated", "bad_json_value") and not (
            (tool_parameters or {}).get("required")):
        return "markup_as_text"
    return kind
