"""What several commands share: loading the profile argument into a Deployment, and the options
repeated across commands (the profile argument, ``--dry-run``, ``--json``)."""

from __future__ import annotations

from typing import Optional

import typer

PROFILE_ARG_HELP = "Profile path or shipped name (default: the embedded dsv4-flash-8xb200-pd)."


def profile_argument() -> object:
    """The optional positional PROFILE argument of most commands."""
    return typer.Argument(None, help=PROFILE_ARG_HELP)


def load_deployment_arg(arg: Optional[str], acts_on_hosts: bool = False):
    """The :class:`~dsv4ctl.profile.deployment.Deployment` of a PROFILE argument (None → the
    embedded default; a shipped name; a path); ``DSV4CTL_PROFILE`` stands in for a missing argument.
    A command that acts on hosts or edits files (``acts_on_hosts``) never falls back to the
    embedded example. InputError (exit 2) for a bad or missing profile."""
    import os

    from ..errors import InputError
    from ..profile.deployment import resolve
    from ..profile.model import load_profile
    from ..resources import resolve_profile
    if arg is None:
        arg = os.environ.get("DSV4CTL_PROFILE") or None
        if arg is None and acts_on_hosts:
            raise InputError("this command changes or reads hosts or files: give the profile (argument or "
                             "DSV4CTL_PROFILE); the embedded example is only for read-only commands (plan, "
                             "config lint, hicache status, runbook show)")
    return resolve(load_profile(resolve_profile(arg)))
