"""dsv4ctl command line: parse, call a core, render. Heavy modules are imported inside commands.

Exit codes: 0 ok · 1 negative verdict (plan does not fit, gate failed, rolled back) ·
2 bad input (nothing changed) · 3 remote/service failure · 130 interrupted."""

from __future__ import annotations

import sys

from . import __version__
from .errors import EXIT_INTERRUPTED, EXIT_REMOTE, EXIT_USAGE, DsvError

HELP = ("Ops toolkit for DeepSeek-V4 on SGLang 0.5.18-0.5.23: plan, patch, deploy, hicache, check, watch, runbooks.\n\n"
        "Exit codes: 0 ok, 1 negative verdict (does not fit / gate failed / rolled back), "
        "2 bad input (nothing changed), 3 remote or service failure, 130 interrupted.")

# Command modules under dsv4ctl/commands/, in --help order. Each defines ``register(app)``;
# a module that is not in the tree is skipped, an import error inside one is raised.
COMMAND_MODULES = ("plan", "facts", "patch", "deploy", "lock", "day2", "execute", "config", "hicache", "check", "diagnose", "runbook",
                   "watch", "report", "profiles", "schema", "completion")
# Top-level command name -> the module that registers it (for the start-up fast path).
COMMAND_OWNER = {"plan": "plan", "facts": "facts", "patch": "patch", "deploy": "deploy", "rollback": "deploy",
                 "releases": "deploy", "promote": "deploy", "start": "deploy", "stop": "deploy",
                 "restart": "deploy", "lock": "lock", "config": "config", "hicache": "hicache", "check": "check",
                 "runbook": "runbook", "diagnose": "diagnose", "report": "report", "watch": "watch", "status": "day2", "logs": "day2",
                 "audit": "day2", "verify": "day2", "exec": "execute", "profile": "profiles", "schema": "schema", "completion": "completion"}


def _version(value: bool) -> None:
    if value:
        import typer
        print(f"dsv4ctl {__version__} (SGLang {', '.join(_supported())})")
        raise typer.Exit()


def _supported() -> list[str]:
    """The SGLang releases dsv4ctl plans and lints for (:mod:`dsv4ctl.plan.versions`)."""
    from .plan.versions import VERSIONS
    return list(VERSIONS)


def version_doc() -> dict:
    """``dsv4ctl --version --json``: dsv4ctl's version, the default SGLang release (``sglang``) and
    every supported one (``sglang_supported``), the Python running it, and where its shipped data
    is read from."""
    import platform

    from .resources import shipped_dir
    return {"schema": "dsv4ctl.version/1", "dsv4ctl": __version__, "sglang": "0.5.23", "sglang_supported": _supported(),
            "python": platform.python_version(), "shipped": str(shipped_dir("profiles").parent)}


def conventions_error(args: list[str]) -> str | None:
    """The one-line usage error for option combinations no command accepts (``--json`` with
    ``--markdown``), else None. Arguments after ``--`` are not options."""
    opts = args[:args.index("--")] if "--" in args else args
    if "--json" in opts and "--markdown" in opts:
        return "--json and --markdown cannot be used together (pick one output format)"
    return None


def build_app(modules: tuple[str, ...] = COMMAND_MODULES, listing_only: bool = False) -> typer.Typer:
    """The typer app with the commands of ``modules`` (default: all of them); ``listing_only``: for
    the top-level help alone, the commands without their parameters (:func:`_listing_only`)."""
    import importlib
    import importlib.util

    import typer

    def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                           help="Print the version and exit.")) -> None:
        """Ops toolkit for DeepSeek-V4 on SGLang 0.5.18-0.5.23."""
        _collect_from_here()        # start-up is over: the command runs with the cyclic GC on

    application = typer.Typer(
        name="dsv4ctl", help=HELP, no_args_is_help=True,
        add_completion=False,   # one completion mechanism: `dsv4ctl completion SHELL` (static scripts)
        pretty_exceptions_enable=False,
        rich_markup_mode=None,  # plain click help: rich help imports ~110 ms (benchmarks/startup.py)
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    application.callback()(_root)
    for name in modules:
        mod_name = f"{__package__}.commands.{name}"
        if importlib.util.find_spec(mod_name) is None:
            continue
        importlib.import_module(mod_name).register(application)
    from .commands.examples import apply as add_examples
    from .commands.grammar import apply as add_profile_option
    from .commands.helptext import apply as whole_help
    add_examples(application)
    add_profile_option(application)
    whole_help(application)     # whole first sentences in command lists, telling metavars
    if listing_only:
        _listing_only(application)
    return application


def _no_parameters() -> None:
    """Stand-in callback of a command that is only listed (:func:`_listing_only`)."""


def _listing_only(application: typer.Typer) -> None:
    """For ``dsv4ctl --help`` (the command list only): every command's callback, recursively,
    replaced by one without parameters, its name, help and short help kept. The list shows names
    and short help (:mod:`.commands.helptext` set them), and typer's conversion of the 41
    commands' parameters to click options was most of the list's CPU (benchmarks/startup.py)."""
    import inspect

    from typer.main import get_command_name
    for info in application.registered_commands:
        if info.callback is None:
            continue
        info.name = info.name or get_command_name(info.callback.__name__)
        if info.help is None:
            info.help = inspect.getdoc(info.callback)
        info.callback = _no_parameters
    for grp in application.registered_groups:
        if grp.typer_instance is not None:
            _listing_only(grp.typer_instance)


def modules_for(argv: list[str]) -> tuple[str, ...]:
    """Only the module that owns the command being run (``dsv4ctl plan ...`` imports the plan
    command alone, which keeps start-up fast); every module for help, completion or a typo."""
    first = next((a for a in argv if not a.startswith("-")), None)
    owner = COMMAND_OWNER.get(first or "")
    return (owner,) if owner else COMMAND_MODULES


def __getattr__(name: str):
    # ``dsv4ctl.cli.app`` (completions generator, tests): the full app, built on first access.
    if name == "app":
        value = build_app()
        globals()["app"] = value
        return value
    raise AttributeError(name)


class _QuietPipe:
    """Standard output or error that stops writing, silently, once its reader has gone
    (``dsv4ctl plan | head -1``; ``deploy ... 2>&1 | tee log`` whose tee died with the terminal's
    Ctrl-C or hangup; a terminal gone, EIO): the exit code stays the command's own (0 fits, 1 does
    not fit) instead of Python's BrokenPipeError, which would exit 1, the code of a negative
    verdict — and, on stderr, a clean-up in progress (a deploy putting hosts back, its audit
    records) is never cut short by its own progress line."""

    def __init__(self, stream):
        self._s = stream
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return self._s.write(text)
            except OSError:
                self._drop()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._s.flush()
            except OSError:
                self._drop()

    def _drop(self) -> None:
        # point the descriptor at /dev/null, so the interpreter's last flush cannot fail either
        import os
        self.gone = True
        try:
            fd = os.open(os.devnull, os.O_WRONLY)
            os.dup2(fd, self._s.fileno())
            os.close(fd)
        except (OSError, ValueError):
            pass

    def __getattr__(self, name):
        return getattr(self._s, name)


def _encodable_output() -> None:
    """On a stdout/stderr whose encoding cannot write every character (a latin-1 or ASCII locale,
    PYTHONIOENCODING=ascii), what it cannot encode is written as ``\\uXXXX`` instead of a
    UnicodeEncodeError traceback (the help's dashes, a host's text)."""
    for stream in (sys.stdout, sys.stderr):
        enc = (getattr(stream, "encoding", None) or "").lower().replace("_", "-")
        if enc not in ("utf-8", "utf8") and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="backslashreplace")
            except (ValueError, OSError):
                pass


def main(argv: list[str] | None = None) -> int:
    """Console entry point: runs the typer app and maps DsvError to a one-line error + exit code.
    ``__complete KIND [PROFILE]`` (the shell completions' helper) is answered before typer is
    imported (:mod:`dsv4ctl.commands.complete`)."""
    args = sys.argv[1:] if argv is None else argv
    if argv is None:
        _encodable_output()
    if args[:1] == ["__complete"]:
        from .commands.complete import run as complete
        return complete(list(args[1:]))
    if argv is None:
        _hold_collection()
    try:
        if (args or ["--help"]) in (["--help"], ["-h"]):
            return _run(argv)         # the command list: no dataclass is built (often it is kept text)
        from .codecache import dataclass_code_cache
        with dataclass_code_cache():  # dataclass methods compiled once, not on every start (codecache)
            return _run(argv)
    finally:
        if argv is None:
            _no_collection_at_exit()


# The cyclic garbage collector and a command run (console runs only, main() without argv; a call
# with argv, as tests make, leaves the collector alone). Start-up (imports, the typer app) makes
# tens of thousands of long-lived objects and almost no cyclic garbage, yet the collector walks
# them again and again; at exit the interpreter collects everything once more before it frees the
# modules. benchmarks/startup.py: `dsv4ctl plan` spent 7 ms collecting during its run and 30 ms
# after main() returned (`import typer` alone: 21 ms).
_held: list[bool] = []


def _hold_collection() -> None:
    """No cyclic collection during start-up (until :func:`_collect_from_here`)."""
    import gc
    if gc.isenabled():
        gc.disable()
        _held.append(True)


def _collect_from_here() -> None:
    """The command starts (the root callback runs, its subcommand next): every object made so far
    is moved to the collector's permanent generation (``gc.freeze()``: modules, classes and
    functions, never garbage) and collection is on again, so a long run (watch, deploy, check
    load) collects its own garbage as always. No-op unless :func:`_hold_collection` held it."""
    if _held:
        import gc
        _held.clear()
        gc.freeze()
        gc.enable()


def _no_collection_at_exit() -> None:
    """After the command: every object still alive is moved to the permanent generation, so the
    interpreter's final collections walk none of them (Python documents no ``__del__`` call for
    objects alive at exit; files and connections are closed by the commands, not by the
    collector); the collector is on again if start-up never finished (usage error, --help)."""
    import gc
    gc.freeze()
    if _held:
        _held.clear()
        gc.enable()


def _print_kept_listing() -> bool:
    """``dsv4ctl --help``: print the command list kept in the cache (:mod:`.commands.listing`);
    False when there is none for this width and code, or when standard output cannot encode it
    (``PYTHONIOENCODING=ascii``: the text is encoded whole before a byte is written, so nothing
    was printed; click's echo, which draws it then, writes such a stream as UTF-8)."""
    from .commands.listing import cached_listing, help_width
    text = cached_listing(help_width())
    if text is None:
        return False
    try:
        sys.stdout.write(text)
    except UnicodeEncodeError:
        return False
    return True


def _keep_listing(application: typer.Typer) -> None:
    """Keep the command list just printed (drawn again from ``application``, as click's help option
    draws it) for the next ``dsv4ctl --help``."""
    from .commands.listing import help_width, keep_listing, listing_text
    try:
        keep_listing(help_width(), listing_text(application))
    except Exception:       # best effort: the list is printed already; the next run draws it again
        pass


def _run(argv: list[str] | None) -> int:
    """:func:`main` past the completion fast path: the command run, DsvError / OSError / usage
    errors mapped to one line and an exit code."""
    import os
    for name in ("stdout", "stderr"):          # started with the descriptor closed (>&-): write nowhere
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w"))
    if argv is None:                           # a Ctrl-C that lands in a weakref callback is not lost
        from .signals import keep_interrupts
        keep_interrupts()
    if argv is None and not isinstance(sys.stdout, _QuietPipe):
        sys.stdout = _QuietPipe(sys.stdout)
    if argv is None and not isinstance(sys.stderr, _QuietPipe):
        sys.stderr = _QuietPipe(sys.stderr)
    args = (sys.argv[1:] if argv is None else argv) or ["--help"]   # bare `dsv4ctl`: the help, not a usage error
    listing = args in (["--help"], ["-h"])
    if listing and _print_kept_listing():
        return 0
    import typer

    from .render import error_line
    try:
        bad = conventions_error(args)
        if bad:
            error_line(bad)
            return EXIT_USAGE
        if "--version" in args and "--json" in args and all(a.startswith("-") for a in args):
            from .render import dump_json
            print(dump_json(version_doc()))
            return 0
        application = build_app(modules_for(args), listing_only=listing)
        result = application(args=args, standalone_mode=False, prog_name="dsv4ctl")
        if listing and result in (None, 0):
            _keep_listing(application)
        if isinstance(result, int) and not isinstance(result, bool) and result:
            # typer turns Ctrl-C into a returned 130 in non-standalone mode
            if result == EXIT_INTERRUPTED:
                error_line("interrupted")
            return result
    except DsvError as e:
        error_line(str(e), e.label)
        return e.exit_code
    except KeyboardInterrupt:
        error_line("interrupted")
        return EXIT_INTERRUPTED
    except typer.Exit as e:
        return e.exit_code
    except SystemExit as e:  # pragma: no cover
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    except OSError as e:      # a local file the command could not use: one line, never a traceback
        import errno
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        error_line(f"{where}{e.strerror or e}")
        bad_input = {errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG, errno.EACCES, errno.ELOOP}
        return EXIT_USAGE if e.errno in bad_input else EXIT_REMOTE
    except Exception as e:  # click usage errors; typer vendors click (typer._click), so no `import click`
        if isinstance(e, typer.Abort):
            error_line("aborted")
            return EXIT_INTERRUPTED
        if hasattr(e, "format_message") and hasattr(e, "exit_code"):  # click.ClickException
            ctx = getattr(e, "ctx", None)
            where = f"{ctx.command_path}: " if ctx is not None else ""
            hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
            error_line(f"{where}{e.format_message()}{hint}")
            return EXIT_USAGE
        raise
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
