"""One grammar for every command, applied where cli.py registers the commands (:func:`apply`;
tests/test_grammar.py walks every command): the profile as positional ``PROFILE`` where a command
takes one and ``-p/--profile PROFILE`` on the same commands (plus ``DSV4CTL_PROFILE``), and
``-v/--verbose`` with ``-q/--quiet`` refused together (exit 2) wherever a command takes both."""

from __future__ import annotations

import functools
import inspect
import typing
from typing import Optional

import typer
from typer.models import ArgumentInfo

from ..errors import InputError

PROFILE_OPTION_HELP = "The profile, as an option: the same as PROFILE (or DSV4CTL_PROFILE); give it once."


def with_profile_option(cb):
    """``cb`` (a command taking a positional ``profile``) with ``-p/--profile`` added: the option
    stands in for the positional; both given is a usage error (exit 2)."""
    sig = inspect.signature(cb)
    hints = typing.get_type_hints(cb)
    params = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in sig.parameters.values()]
    params.append(inspect.Parameter("profile_opt", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[str],
                                    default=typer.Option(None, "--profile", "-p", metavar="PROFILE",
                                                         help=PROFILE_OPTION_HELP)))

    @functools.wraps(cb)
    def wrapper(**kwargs):
        opt = kwargs.pop("profile_opt", None)
        if opt is not None:
            if kwargs.get("profile") is not None:
                raise InputError(f"the profile is given twice ({kwargs['profile']} and -p {opt}): give it once")
            kwargs["profile"] = opt
        return cb(**kwargs)
    wrapper.__signature__ = sig.replace(parameters=params)
    wrapper.__annotations__ = {**{p.name: p.annotation for p in params}, "return": hints.get("return")}
    del wrapper.__wrapped__          # typer must read the new signature, not follow back to cb
    return wrapper


VERBOSE_QUIET_ERROR = "-v/--verbose and -q/--quiet cannot be used together (pick one)"


def refusing_verbose_with_quiet(cb):
    """``cb`` (a command taking ``verbose`` and ``quiet``) that stops with a usage error (exit 2)
    when both are given, before anything is read."""
    @functools.wraps(cb)
    def wrapper(**kwargs):
        if kwargs.get("verbose") and kwargs.get("quiet"):
            raise InputError(VERBOSE_QUIET_ERROR)
        return cb(**kwargs)
    return wrapper


def takes_verbose_and_quiet(cb) -> bool:
    return {"verbose", "quiet"} <= set(inspect.signature(cb).parameters)


def takes_positional_profile(cb) -> bool:
    p = inspect.signature(cb).parameters.get("profile")
    return p is not None and isinstance(p.default, ArgumentInfo)


def apply(app) -> None:
    """Give every command of the typer ``app`` (and its sub-apps) that takes a positional
    ``profile`` a ``-p/--profile`` option too; refuse ``-v`` with ``-q`` on every command taking both."""
    for info in app.registered_commands:
        if info.callback is not None and takes_positional_profile(info.callback):
            info.callback = with_profile_option(info.callback)
        if info.callback is not None and takes_verbose_and_quiet(info.callback):
            info.callback = refusing_verbose_with_quiet(info.callback)
    for grp in app.registered_groups:
        if grp.typer_instance is not None:
            apply(grp.typer_instance)
