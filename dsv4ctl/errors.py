"""Exit codes and the one exception type the CLI turns into a one-line error.

Exit codes (documented in the README and ``dsv4ctl --help``):

* 0 — success / gate passed
* 1 — the command ran and its verdict is negative (plan does not fit, check gate failed,
  deploy rolled back)
* 2 — bad input: usage, profile, serve config, model config, patch series (nothing was changed)
* 3 — a remote or service operation failed (SSH, HTTP, health) after validation
* 130 — interrupted
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_REMOTE = 3
EXIT_INTERRUPTED = 130


class DsvError(Exception):
    """An error with a one-line message and an exit code; never shown as a traceback. ``label``
    is the word the CLI prints before the message (``dsv4ctl: <label>: <message>``)."""

    exit_code = EXIT_USAGE
    label = "error"

    def __init__(self, message: str, exit_code: int | None = None, label: str | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
        if label is not None:
            self.label = label


class InputError(DsvError):
    """Bad user input (exit 2). Messages name ``file:line`` and the field where known."""

    exit_code = EXIT_USAGE


class VerdictError(DsvError):
    """The command ran; its verdict is negative (exit 1). Never printed as ``error``: the label
    is the verdict's word (``failed`` unless the raise names one: ``unhealthy``, ``drift``,
    ``differs``, ``refused``, ``check failed``, ``plan differs``, ``diagnosis``)."""

    exit_code = EXIT_FAILED
    label = "failed"


class GateFailed(VerdictError):
    """A health or promotion gate failed (the hosts were put back): a verdict on the release, not
    an error of the command. Printed as ``dsv4ctl: gate failed: <message>``; exit 1, or the code
    given (a ``rollback`` whose own gate fails is 3)."""

    label = "gate failed"


class PlanFails(VerdictError):
    """A plan whose verdict is ``fails`` (exit 1): printed as ``dsv4ctl: plan fails: GROUP: why``,
    the plan's own verdict line, not an error of the command."""

    label = "plan fails"


class RemoteError(DsvError):
    """A remote/service operation failed (exit 3)."""

    exit_code = EXIT_REMOTE
