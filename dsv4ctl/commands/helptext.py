"""``--help`` that reads whole, applied where cli.py registers the commands (:func:`apply`;
tests/test_helptext.py walks every command): each command list shows a command's whole first
sentence (click cut it at the terminal's width with ``...``), and every option that takes a
value names what it takes (``-g, --group GROUP``, ``--health-timeout DURATION``), never the
type's generic ``<str>``, ``TEXT`` or ``INTEGER``."""

from __future__ import annotations

import inspect

#: Metavars click and typer print for a value of a type (what the help must never show).
GENERIC_METAVARS = frozenset({"TEXT", "INTEGER", "FLOAT", "PATH", "FILENAME", "BOOLEAN", "<str>", "<int>",
                              "<float>", "<path>", "<bool>", "<text>", "<integer>", "<filename>"})

#: Option (its Python parameter name) -> what its value is; ``(command, name)`` where one name
#: means another thing in one command. An option missing here shows its own name upper-cased.
METAVARS: dict[str, str] = {
    "group": "GROUP", "host": "HOST", "profile": "PROFILE", "profile_opt": "PROFILE", "tree": "TREE", "base": "REF",
    "patch": "FILE", "canary": "GROUP|HOST", "concurrency": "N[,N...]", "max_corruption": "FRACTION",
    "turns": "N", "min_requests": "N", "message": "MESSAGE", "batch": "N", "lines": "N", "grep": "REGEX",
    "release": "ID", "api_key": "KEY", "listen": "HOST:PORT", "on_alert": "[CONDITION=]RUNBOOK", "log": "FILE",
    "print_": "ARTIFACT", "output": "FILE", "title": "TITLE", "series": "DIR", "keep": "DIR", "unset": "KEY",
    "ratio": "RATIO", "write_policy": "POLICY", "io_backend": "BACKEND", "mem_layout": "LAYOUT",
    "storage_backend": "BACKEND", "model": "MODEL", "stream": "on|off|mixed", "records": "FILE",
    "answer_words": "WORDS", "turns_csv": "FILE", "resume": "ID", "report_dir": "DIR", "evidence": "REASON",
    "out": "FILE", "to": "ID",
}
COMMAND_METAVARS: dict[tuple[str, str], str] = {
    ("patch check", "base"): "PACKAGE==VERSION",
}


_ABBREVIATIONS = frozenset({"e.g.", "i.e.", "vs.", "cf."})


def first_sentence(text: str | None) -> str:
    """The first sentence of a help text's first paragraph, whitespace collapsed (click 8's own
    rule, ``click.utils.make_default_short_help``, without its length limit): up to the first
    word ending in ``.`` that is not an abbreviation (``e.g.``, ``i.e.``, ``vs.``, ``cf.``; click
    cut "Set ... serve configs, e.g." there), else the whole paragraph; a leading ``\\b``
    (no-rewrap) marker skipped."""
    words = inspect.cleandoc(text or "").split("\n\n", 1)[0].split()
    if words[:1] == ["\b"]:
        words = words[1:]
    end = next((i for i, w in enumerate(words) if w.endswith(".") and w.lower() not in _ABBREVIATIONS),
               len(words) - 1)
    return " ".join(words[:end + 1])


def plain(text: str | None) -> str | None:
    """A docstring as ``--help`` prints it: reStructuredText literals (double backquotes, as the
    module docs write them) become the single backquotes the rest of the help uses."""
    return text.replace("``", "`") if text else text


def metavar_for(command: str, name: str) -> str:
    """The metavar of option ``name`` (its Python parameter) of ``command`` (``"patch check"``)."""
    return COMMAND_METAVARS.get((command, name)) or METAVARS.get(name) or name.upper().replace("_", "-")


def _name_metavars(callback, command: str) -> None:
    """Give every value-taking option of ``callback`` without a telling metavar the one of
    :func:`metavar_for` (the OptionInfo defaults are shared by name, so one name, one metavar)."""
    from typer.models import OptionInfo
    for p in inspect.signature(callback).parameters.values():
        info = p.default
        if not isinstance(info, OptionInfo) or p.annotation in (bool, "bool"):
            continue
        if info.metavar is None or info.metavar in GENERIC_METAVARS:
            info.metavar = metavar_for(command, p.name)


def _help_of(info, fallback) -> str:
    """A typer info's help: its own ``help`` when set (not a DefaultPlaceholder), else ``fallback``."""
    from typer.models import DefaultPlaceholder
    h = info.help
    return fallback if h is None or isinstance(h, DefaultPlaceholder) else h


def apply(app, prefix: str = "") -> None:
    """Set ``short_help`` (the whole first sentence) and option metavars on every command and
    sub-group registered on the typer ``app``, recursively."""
    from typer.models import DefaultPlaceholder
    for info in app.registered_commands:
        if info.callback is None:
            continue
        name = info.name or info.callback.__name__.replace("_", "-")
        info.help = plain(_help_of(info, inspect.getdoc(info.callback)))
        if info.short_help is None or isinstance(info.short_help, DefaultPlaceholder):
            info.short_help = first_sentence(info.help)
        _name_metavars(info.callback, f"{prefix}{name}")
    for grp in app.registered_groups:
        sub = grp.typer_instance
        if sub is None:
            continue
        if not isinstance(grp.help, DefaultPlaceholder) and grp.help is not None:
            grp.help = plain(grp.help)
        if not isinstance(sub.info.help, DefaultPlaceholder) and sub.info.help is not None:
            sub.info.help = plain(sub.info.help)
        if grp.short_help is None or isinstance(grp.short_help, DefaultPlaceholder):
            grp.short_help = first_sentence(_help_of(grp, _help_of(sub.info, None)))
        apply(sub, f"{prefix}{grp.name} ")
