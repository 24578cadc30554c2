"""What several commands share: loading the profile argument into a Deployment, and the options
repeated across commands (the profile argument, ``--dry-run``, ``--json``)."""

from __future__ import annotations

from typing import Optional

import typer

PROFILE_ARG_HELP = "Profile path or shipped name (default: the embedded dsv4-flash-8xb200-pd)."


def profile_argument() -> object:
    """The optional positional PROFILE argument of most commands."""
    return typer.Argument(None, help=PROFILE_ARG_HELP)


def load_deployment_arg(arg: Optional[str]):
    """The :class:`~dsv4ctl.profile.deployment.Deployment` of a PROFILE argument (None → the
    embedded default; a shipped name; a path). InputError (exit 2) for a bad profile."""
    from ..profile.deployment import resolve
    from ..profile.model import load_profile
    from ..resources import resolve_profile
    return resolve(load_profile(resolve_profile(arg)))
