"""SGLang 0.5.18-0.5.22's DeepSeek-V4 output path, for the STAND-IN server (tests only).

Before 0.5.23 (which parses DeepSeek-V4 output on token IDs with deepseek-recipe:
:mod:`tests.standin.served`), SGLang detokenizes the output to text and ``serving_chat`` runs
``FunctionCallParser`` with the regex ``DeepSeekV4Detector``
(``srt/function_call/deepseekv4_detector.py``, a ``DeepSeekV32Detector`` with the ``tool_calls``
block name). What a client receives follows from that (0.5.22 ``serving_chat.py``):

* the text is decoded with ``skip_special_tokens=False`` when the request has tools and
  ``tool_choice`` is not ``"none"`` (so DSML tags survive to the detector), else with special
  tokens skipped (the ``｜DSML｜`` and ``</think>`` tokens vanish from what the model wrote);
* a DSML block sampled as ordinary tokens decodes to the very same text as the special tokens:
  the detector parses it (the 0.5.23 incident shape "markup as text" does not exist here);
* ``_process_tool_calls``: ``detect_and_parse`` gives the content before the block (its trailing
  blank line removed) and the calls; the ``finish_reason`` becomes ``tool_calls`` only from
  ``stop``; a call to an undeclared tool is dropped (``parse_base_json``,
  ``SGLANG_FORWARD_UNKNOWN_TOOLS`` off); string parameters are stripped; a ``string="false"``
  value that is not JSON becomes a string; a JSON-body invoke is parsed;
* malformed or unclosed invokes: 0.5.21/0.5.22 drop the invoke and keep the prose ("fail
  closed"); 0.5.18-0.5.20 return the whole text as content when parsing raises ("fail open": raw
  DSML reaches the client).

This module runs *the release's own detector code*: ``deepseekv32_detector.py`` and
``deepseekv4_detector.py`` from the release's wheel (the oracle environment's
``versions/<release>/sglang``, or ``$DSV4CTL_SGLANG_VERSIONS/<release>/sglang``). Their imports of
the rest of SGLang (``protocol.Tool``, ``BaseFormatDetector``, ``core_types``, pydantic,
partial_json_parser: not installed in the test environment) are satisfied by the small stand-ins
below, which implement only what ``detect_and_parse`` uses (``parse_base_json``,
``_get_tool_indices`` as in 0.5.22's ``base_format_detector.py``). The reasoning split is not
SGLang's code: with thinking requested the text up to the first ``</think>`` is
``reasoning_content`` (what ``DeepSeekV4Detector`` of ``reasoning_parser.py`` does for a
well-formed answer); without thinking the text is left whole, as its ``detect_and_parse`` does
when no think start token is in the text.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[2]
DEFAULT_VERSIONS = REPO / ".venv-oracle" / "versions"
DETECTOR_RELEASES = ("0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22")
THINK_END = "</think>"


class DetectorUnavailable(RuntimeError):
    """The release's detector source is not there (one line saying where it was looked for)."""


def release_src(version: str) -> Path:
    """The ``sglang`` package folder of SGLang ``version``: ``$DSV4CTL_SGLANG_VERSIONS/<v>/sglang``
    or the oracle environment's (``bash scripts/oracle-env.sh`` unpacks every supported wheel)."""
    base = Path(os.environ.get("DSV4CTL_SGLANG_VERSIONS") or DEFAULT_VERSIONS)
    p = base / version / "sglang"
    if not (p / "srt" / "function_call" / "deepseekv4_detector.py").is_file():
        raise DetectorUnavailable(f"SGLang {version} source not found at {p}; run: bash scripts/oracle-env.sh")
    return p


# --- stand-ins for the SGLang modules the detector imports --------------------------------------

@dataclass
class ToolCallItem:
    """``core_types.ToolCallItem`` (a pydantic model in SGLang)."""

    tool_index: int
    name: Optional[str] = None
    parameters: str = ""


@dataclass
class StreamingParseResult:
    """``core_types.StreamingParseResult``."""

    normal_text: str = ""
    calls: list = field(default_factory=list)


@dataclass
class StructureInfo:
    begin: str
    end: str
    trigger: str


class BaseFormatDetector:
    """What ``detect_and_parse`` of the DeepSeek detectors uses of SGLang 0.5.22's
    ``base_format_detector.BaseFormatDetector``: the streaming state fields, ``_get_tool_indices``
    and ``parse_base_json`` (unknown tools skipped, ``SGLANG_FORWARD_UNKNOWN_TOOLS`` unset)."""

    def __init__(self):
        self._buffer = ""
        self.prev_tool_call_arr: list = []
        self.current_tool_id = -1
        self.current_tool_name_sent = False
        self.streamed_args_for_tool: list = []
        self.bot_token = ""
        self.eot_token = ""

    def _get_tool_indices(self, tools: list) -> dict:
        return {t.function.name: i for i, t in enumerate(tools) if t.function.name}

    def parse_base_json(self, action: Any, tools: list) -> list:
        indices = self._get_tool_indices(tools)
        out = []
        for act in action if isinstance(action, list) else [action]:
            name = act.get("name")
            if not (name and name in indices):
                continue
            out.append(ToolCallItem(tool_index=indices.get(name, -1), name=name,
                                    parameters=json.dumps(act.get("parameters") or act.get("arguments", {}),
                                                          ensure_ascii=False)))
        return out


def _stub_modules() -> dict[str, types.ModuleType]:
    def mod(name: str, **attrs) -> types.ModuleType:
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        return m
    pj = mod("partial_json_parser")
    return {
        "sglang.srt.entrypoints": mod("sglang.srt.entrypoints", __path__=[]),
        "sglang.srt.entrypoints.openai": mod("sglang.srt.entrypoints.openai", __path__=[]),
        "sglang.srt.entrypoints.openai.protocol": mod("sglang.srt.entrypoints.openai.protocol", Tool=Any),
        "sglang.srt.function_call": mod("sglang.srt.function_call", __path__=[]),
        "sglang.srt.function_call.base_format_detector": mod(
            "sglang.srt.function_call.base_format_detector", BaseFormatDetector=BaseFormatDetector),
        "sglang.srt.function_call.core_types": mod(
            "sglang.srt.function_call.core_types", StreamingParseResult=StreamingParseResult,
            ToolCallItem=ToolCallItem, StructureInfo=StructureInfo, _GetInfoFunc=Any),
        "sglang.srt.function_call.utils": mod(
            "sglang.srt.function_call.utils", _find_common_prefix=None, _partial_json_loads=None),
        "partial_json_parser": pj,
        "partial_json_parser.core": mod("partial_json_parser.core", __path__=[]),
        "partial_json_parser.core.exceptions": mod("partial_json_parser.core.exceptions", MalformedJSON=ValueError),
        "partial_json_parser.core.options": mod("partial_json_parser.core.options", Allow=None),
    }


@functools.lru_cache(maxsize=None)
def detector_class(version: str) -> type:
    """``DeepSeekV4Detector`` of SGLang ``version`` (0.5.18-0.5.22), loaded from its wheel's
    source with the stand-in modules above in place for the duration of the import (the modules
    of other releases and of 0.5.23's served path are left as they were)."""
    if version not in DETECTOR_RELEASES:
        raise ValueError(f"SGLang {version} has no regex-detector output path ({', '.join(DETECTOR_RELEASES)})")
    src = release_src(version) / "srt" / "function_call"
    stubs = _stub_modules()
    for name in ("sglang", "sglang.srt"):
        if name not in sys.modules:
            stubs[name] = types.ModuleType(name)
            stubs[name].__path__ = []
    names = list(stubs) + ["sglang.srt.function_call.deepseekv32_detector", "sglang.srt.function_call.deepseekv4_detector"]
    saved = {n: sys.modules.get(n) for n in names}
    try:
        sys.modules.update(stubs)
        loaded = None
        for stem in ("deepseekv32_detector", "deepseekv4_detector"):
            name = f"sglang.srt.function_call.{stem}"
            spec = importlib.util.spec_from_file_location(name, src / f"{stem}.py")
            loaded = importlib.util.module_from_spec(spec)
            sys.modules[name] = loaded
            spec.loader.exec_module(loaded)
        return loaded.DeepSeekV4Detector
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m


def _tools(body: dict) -> list:
    """The request's tools as objects with ``.function.name`` (what the detector reads)."""
    out = []
    for t in body.get("tools") or ():
        fn = (t or {}).get("function") or {} if isinstance(t, dict) else {}
        out.append(types.SimpleNamespace(function=types.SimpleNamespace(name=fn.get("name"))))
    return out


@dataclass
class DetectorOutput:
    """What the client gets on the detector path: ``content``, ``reasoning`` (None: none),
    ``calls`` [(name, arguments JSON text)] in order."""

    content: str
    reasoning: Optional[str]
    calls: list


def parse(version: str, tokenizer: Any, ids: list[int], body: dict, *, parse_tools: bool,
          separate_reasoning: bool, thinking: bool) -> DetectorOutput:
    """The detector path of SGLang ``version`` on the model's token ``ids`` for request ``body``
    (module docstring): decode, split the reasoning, run the release's ``DeepSeekV4Detector``
    when ``parse_tools`` (tools declared, ``tool_choice`` not ``none``, a tool parser set)."""
    text = tokenizer.decode(ids, skip_special_tokens=not parse_tools)
    reasoning = None
    if separate_reasoning and thinking:
        head, sep, rest = text.partition(THINK_END)
        reasoning, text = (head, rest) if sep else (text, "")
    calls: list = []
    if parse_tools:
        det = detector_class(version)()
        if det.has_tool_call(text):
            res = det.detect_and_parse(text, _tools(body))
            text = res.normal_text
            calls = [(c.name, c.parameters) for c in res.calls]
    return DetectorOutput(text, reasoning, calls)
