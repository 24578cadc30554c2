"""Stand-in for ``torchvision`` so that SGLang 0.5.23 imports on a CPU-only torch.

``sglang.srt.configs`` imports torchvision through several vision-language configs; the
torchvision wheels built for torch 2.13 are CUDA builds whose compiled extension fails against
the CPU torch of ``.venv-oracle``. Nothing on the DeepSeek-V4 pool-sizing path uses torchvision,
so every ``torchvision`` / ``torchvision.*`` import is answered with a permissive module
(capacity reference §5.2). :func:`install` must run before the first ``sglang`` import.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import importlib.util
import pathlib
import shutil
import sys
import tempfile
import types


class _Base:
    """What a class deriving from a stub derives from: takes class keywords (``total=False`` of a
    TypedDict such as openai's ``EasyInputMessageParam``)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__()

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        """Any value, when a pydantic model has a field of a stub type."""
        from pydantic_core import core_schema
        return core_schema.any_schema()


class _Anything(type):
    """A class whose attributes are classes like itself: callable (also as a no-op decorator),
    subscriptable, combinable with ``|``, iterable (empty), usable as a base, falsy."""

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Anything(name, (_Base,), {})

    def __call__(cls, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return _Anything("instance", (_Base,), {})

    def __getitem__(cls, _):
        return cls

    def __or__(cls, _):
        return cls

    __ror__ = __or__

    def __iter__(cls):
        return iter(())

    def __bool__(cls):
        return False

    def __len__(cls):
        return 0

    def __mro_entries__(cls, bases):
        return (_Base,)


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Anything(name, (_Base,), {})


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots):
        self.roots = tuple(roots)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = _StubModule(spec.name)
        mod.__path__ = []
        return mod

    def exec_module(self, module):
        pass


_installed: tuple | bool = False

# What 0.5.20's server_args.py imports at module level through FunctionCallParser (0.5.21+ import
# the parser lazily, for the --tool-call-parser choices) and the oracle environment, built for
# 0.5.23, does not install. Nothing on the pool-sizing or argument path uses them.
FUNCTION_CALL_DEPS = ("openai", "partial_json_parser", "xgrammar")


def eager_function_call_parser() -> bool:
    """Whether the ``sglang`` first on ``sys.path`` (not imported) imports FunctionCallParser when
    ``server_args`` is imported (0.5.20 and older)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return False
    src = pathlib.Path(list(spec.submodule_search_locations)[0]) / "srt" / "server_args.py"
    text = src.read_text() if src.exists() else ""
    return "\nfrom sglang.srt.function_call.function_call_parser import FunctionCallParser" in text


def roots_for_sglang(base=("torchvision",)) -> tuple:
    """``base`` plus, for a release that imports FunctionCallParser eagerly, whichever of
    :data:`FUNCTION_CALL_DEPS` is not installed."""
    extra = FUNCTION_CALL_DEPS if eager_function_call_parser() else ()
    return tuple(base) + tuple(m for m in extra if missing(m))


def missing(name: str) -> bool:
    """Whether the top-level module ``name`` is not installed: a module these stubs answer counts
    as not installed (what a new process finds before :func:`install`)."""
    return name in (_installed or ()) or importlib.util.find_spec(name) is None


def install(roots=("torchvision",)) -> None:
    """Answer imports of ``roots`` with stub modules and publish a fake ``<root>-0.0.0.dist-info``
    (transformers' ``is_torchvision_greater_or_equal`` reads the version). Idempotent;
    RuntimeError when already installed for other ``roots`` (a forked child of the oracle's
    fork server, :mod:`tests.oracle.zygote`, must stub what a new process would)."""
    global _installed
    if _installed:
        if set(roots) != set(_installed):
            raise RuntimeError(f"stubs installed for {sorted(_installed)}, this run wants {sorted(roots)}")
        return
    sys.meta_path.insert(0, _Finder(roots))
    site = pathlib.Path(tempfile.mkdtemp(prefix="dsv4ctl-fake-dist-"))
    for root in roots:
        info = site / f"{root}-0.0.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {root}\nVersion: 0.0.0\n")
    sys.path.append(str(site))
    atexit.register(shutil.rmtree, site, True)
    _installed = tuple(roots)


def tolerate_config_reregistration() -> None:
    """``AutoConfig.register(..., exist_ok=True)``: 0.5.19 and older register configs (e.g.
    ``qwen3_asr``) that the oracle environment's transformers (5.19, 0.5.23's pin; they pin 5.12.1)
    already ships, which raises at import. A release that registers nothing transformers has
    (0.5.20+) is unaffected; no DeepSeek-V4 code reads those configs."""
    import transformers
    auto = transformers.AutoConfig
    if getattr(auto.register, "_dsv4ctl", False):
        return
    orig = auto.register

    def register(model_type, config, exist_ok=False):
        return orig(model_type, config, exist_ok=True)

    register._dsv4ctl = True
    auto.register = staticmethod(register)
