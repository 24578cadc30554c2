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
import pathlib
import shutil
import sys
import tempfile
import types


class _Anything(type):
    """A class whose attributes are classes like itself: callable (also as a no-op decorator),
    subscriptable, combinable with ``|``, iterable (empty), usable as a base, falsy."""

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Anything(name, (), {})

    def __call__(cls, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return _Anything("instance", (), {})

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
        return (object,)


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Anything(name, (), {})


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


_installed = False


def install(roots=("torchvision",)) -> None:
    """Answer imports of ``roots`` with stub modules and publish a fake ``<root>-0.0.0.dist-info``
    (transformers' ``is_torchvision_greater_or_equal`` reads the version). Idempotent."""
    global _installed
    if _installed:
        return
    sys.meta_path.insert(0, _Finder(roots))
    site = pathlib.Path(tempfile.mkdtemp(prefix="dsv4ctl-fake-dist-"))
    for root in roots:
        info = site / f"{root}-0.0.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {root}\nVersion: 0.0.0\n")
    sys.path.append(str(site))
    atexit.register(shutil.rmtree, site, True)
    _installed = True
