"""A fork server for the oracle environment: ``.venv-oracle/bin/python ARGS`` without paying
torch's and transformers' imports again per run.

Nearly all of an oracle process's CPU is importing torch, transformers, triton, sympy and the
rest of SGLang's third-party stack (measured on this machine kind: 7.8 of 9.0 CPU-s of a
patched-tree configurator run, :mod:`tests.patchoracle.driver`); SGLang itself is a tenth. One
server per pytest process (and stub set, below) imports that stack once
(:data:`PRELOAD`) and forks a child per run, which becomes exactly ``python ARGS`` with the run's
environment, ``PYTHONPATH``, working directory and stdio: ``sys.path`` is the one a new process
would get, warnings and bytecode flags are set from ``-W``/``PYTHONWARNINGS`` and
``PYTHONDONTWRITEBYTECODE``, and SGLang — never imported by the server — is imported by the
child from whichever tree is first on its path, after the run's ``SGLANG_*`` switches are set.
The machinery (socket protocol, stdio passing, exit) is :mod:`tests.cliserver`'s.

The torchvision stub (:mod:`tests.oracle.tv_stub`) must be in place before transformers is
imported (transformers caches what it finds), and releases that import ``FunctionCallParser``
eagerly (0.5.20 and older) stub more modules: so there is one server per stub set
(:func:`default_stubs`, or the caller's), and :func:`tests.oracle.tv_stub.install` refuses a
different set in a child. What differs from a new process: the packages were imported under the
server's environment (``OMP_NUM_THREADS=1``, as :mod:`tests.oracle.runner` sets for its runs, and
no ``SGLANG_*``: SGLang reads those, and it is imported by the child), and ``-W`` filters go on
top of those the packages added at import (stderr only). Every answer is still compared with a
stored one by the tests (versions_answers.json, oracle_matrix.json, the argument tables, the
start-up matrix). ``DSV4CTL_TEST_FORK=0`` runs a new process per run instead, as before.

Usage (client, any Python): :func:`run` with the interpreter's arguments, as ``subprocess.run``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ORACLE_PY = REPO / ".venv-oracle" / "bin" / "python"
SITE_SGLANG = REPO / ".venv-oracle" / "lib" / "python3.11" / "site-packages" / "sglang"

#: Imported once by the server: the third-party packages (and torch's lazily imported parts) that
#: SGLang's configurator and argument pipeline import (``-X importtime`` of a driver run: 90 % of
#: its import time). Never SGLang or the stubbed modules. A name that fails to import is left to
#: the child.
PRELOAD = ("numpy", "torch", "torch._dynamo", "torch._inductor", "torch._inductor.lowering",
           "torch._inductor.decomposition", "torch._inductor.ir",
           "torch._inductor.kernel.flex.flex_attention", "torch._decomp.decompositions",
           "torch._meta_registrations", "torch._prims", "torch._refs", "torch.distributed",
           "torch.distributed.tensor", "torch.distributed._functional_collectives",
           "torch.fx.experimental.const_fold", "torch.onnx", "torch.utils.data", "triton",
           "triton.language", "sympy", "networkx", "transformers", "transformers.configuration_utils",
           "transformers.activations", "transformers.utils.hub", "huggingface_hub", "aiohttp",
           "pydantic", "starlette", "compressed_tensors", "gguf", "mpmath", "IPython",
           "safetensors", "tokenizers", "zmq", "orjson", "psutil", "requests")


def eager_parser(pythonpath: str) -> bool:
    """Whether the ``sglang`` a run with ``PYTHONPATH=pythonpath`` imports (its first entry holding
    ``sglang/``, else the oracle environment's 0.5.23) imports FunctionCallParser with
    ``server_args`` (0.5.20 and older: :func:`tests.oracle.tv_stub.eager_function_call_parser`)."""
    src = SITE_SGLANG
    for entry in [e for e in pythonpath.split(os.pathsep) if e]:
        if (Path(entry) / "sglang" / "__init__.py").is_file():
            src = Path(entry) / "sglang"
            break
    f = src / "srt" / "server_args.py"
    text = f.read_text() if f.is_file() else ""
    return "\nfrom sglang.srt.function_call.function_call_parser import FunctionCallParser" in text


# -- the server side (runs in .venv-oracle) --------------------------------------------------------

_BASE_PATH: list = []


def _preload(stubs: tuple) -> None:
    import importlib
    import importlib.util
    if stubs:
        from tests.oracle import tv_stub
        tv_stub.install(tuple(m for m in stubs if importlib.util.find_spec(m) is None))
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:       # noqa: BLE001 - the child imports it (or fails) as a new process would
            pass
    _BASE_PATH[:] = sys.path[1:]      # without the server's own first entry (its working directory)


def _warnings(options: list[str]) -> None:
    """``PYTHONWARNINGS`` then ``-W`` ``options`` on top of the filters the server has (Python's
    defaults and what the preloaded packages added)."""
    import warnings
    env = [o for o in os.environ.get("PYTHONWARNINGS", "").split(",") if o]
    for opt in env + options:          # later options take precedence (inserted first)
        warnings._setoption(opt)


def _main(argv: list[str]):
    """In the forked child: become ``python ARGV`` (``[-W OPT]... (-m MODULE | -c CODE | SCRIPT)
    ARGS``)."""
    import atexit
    import importlib
    import io
    import runpy
    import shutil
    from tests.cliserver import _fresh_stdio
    atexit.unregister(shutil.rmtree)      # the server's stub folder is the server's to remove
    opts = []
    while argv and argv[0] == "-W":
        opts.append(argv[1])
        argv = argv[2:]
    mode, target, args = (argv[0], argv[1], argv[2:]) if argv[0] in ("-m", "-c") else ("", argv[0], argv[1:])
    head = os.getcwd() if mode == "-m" else "" if mode == "-c" else os.path.dirname(os.path.realpath(target))
    sys.path[:] = [head] + [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e] + _BASE_PATH
    importlib.invalidate_caches()
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    _warnings(opts)
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8")
    _fresh_stdio()
    if mode == "-m":
        sys.argv = ["-m", *args]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    elif mode == "-c":
        sys.argv = ["-c", *args]
        import types
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        exec(compile(target, "<string>", "exec"), main.__dict__)
    else:
        sys.argv = [target, *args]
        runpy.run_path(target, run_name="__main__")
    return 0


def serve(path: str, stubs: tuple) -> None:
    """Preload (with ``stubs`` stubbed first when missing: :func:`tests.oracle.tv_stub.install`),
    then serve forked runs on the unix socket ``path`` (:func:`tests.cliserver.serve`)."""
    from tests import cliserver
    cliserver.KINDS["oracle"] = (lambda: _preload(stubs), _main)
    cliserver.serve(path, "oracle")


# -- the client side (any Python) -------------------------------------------------------------------

_SERVERS: dict = {}
_LOCK = threading.Lock()        # runner.run_cases asks from several threads


def default_stubs(pythonpath: str) -> tuple:
    """The modules :mod:`tests.oracle.driver` stubs for the ``sglang`` of ``pythonpath``
    (:func:`tests.oracle.tv_stub.roots_for_sglang`; the server keeps those installed)."""
    from tests.oracle.tv_stub import FUNCTION_CALL_DEPS
    return ("torchvision",) + (FUNCTION_CALL_DEPS if eager_parser(pythonpath) else ())


def _server(stubs: tuple):
    """This process's server for the stub set ``stubs`` (started on first use, stopped at exit or
    by :func:`close_all`). A server holds about 480 MB (torch); there are three stub sets."""
    if stubs not in _SERVERS:
        import atexit
        import tempfile

        from tests.cliserver import Server

        class OracleServer(Server):
            def __init__(self, path: str, log: str):
                self.path = path
                env = {k: v for k, v in os.environ.items()
                       if not k.startswith("SGLANG_") and k not in ("PYTHONPATH", "PYTHONWARNINGS")}
                env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
                env.pop("PYTHONDONTWRITEBYTECODE", None)
                self.proc = subprocess.Popen(
                    [str(ORACLE_PY), "-m", "tests.oracle.zygote", path, *stubs],
                    cwd=str(REPO), env=env, stdin=subprocess.PIPE, stdout=open(log, "ab"),
                    stderr=subprocess.STDOUT, start_new_session=True)

            def _connect(self, timeout: float = 600):
                # the socket is bound after the preload: ~6 CPU-s, minutes of wall on a busy machine
                return super()._connect(timeout)
        d = tempfile.mkdtemp(prefix="dsv4ctl-oracle-")
        srv = OracleServer(os.path.join(d, "sock"), os.path.join(d, "server.log"))
        _SERVERS[stubs] = srv
        atexit.register(srv.close)
    return _SERVERS[stubs]


def close_all() -> None:
    """Stop this process's servers (a later :func:`run` starts them again)."""
    with _LOCK:
        while _SERVERS:
            _SERVERS.popitem()[1].close()


def run(args: list[str], env: dict, cwd: str | Path = REPO, input: str | None = None,
        timeout: float = 600, stubs: tuple | None = None) -> subprocess.CompletedProcess:
    """``.venv-oracle/bin/python ARGS`` with exactly ``env``, as ``subprocess.run(...,
    capture_output=True, text=True)`` returns it: a forked child of this process's server for
    the modules the run stubs (``stubs``; None: :func:`default_stubs` of its ``PYTHONPATH``, what
    :mod:`tests.oracle.driver` stubs), or with ``DSV4CTL_TEST_FORK=0`` a new process.
    subprocess.TimeoutExpired when it runs longer than ``timeout`` seconds."""
    argv = [str(ORACLE_PY), *args]
    if os.environ.get("DSV4CTL_TEST_FORK", "1") == "0":
        return subprocess.run(argv, cwd=str(cwd), env=env, input=input, capture_output=True, text=True,
                              timeout=timeout)
    with _LOCK:
        server = _server(default_stubs(env.get("PYTHONPATH", "")) if stubs is None else tuple(stubs))
    code, out, err = server.run(
        [str(a) for a in args], dict(env), str(cwd), input, timeout)
    return subprocess.CompletedProcess(argv, code, out, err)


if __name__ == "__main__":
    serve(sys.argv[1], tuple(sys.argv[2:]))
