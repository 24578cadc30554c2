"""``dsv4ctl completion bash|zsh|fish``: print the shipped completion script (generated from the
CLI by scripts/gen_completions.py; tests/test_completions.py keeps it in sync)."""

from __future__ import annotations

import sys

import typer

FILES = {"bash": "dsv4ctl.bash", "zsh": "_dsv4ctl", "fish": "dsv4ctl.fish"}
INSTALL = {
    "bash": "mkdir -p ~/.local/share/bash-completion/completions && dsv4ctl completion bash > "
            "~/.local/share/bash-completion/completions/dsv4ctl   # or: source <(dsv4ctl completion bash)",
    "zsh": "mkdir -p ~/.zfunc && dsv4ctl completion zsh > ~/.zfunc/_dsv4ctl   "
           "# with fpath+=(~/.zfunc) before compinit in ~/.zshrc",
    "fish": "mkdir -p ~/.config/fish/completions && dsv4ctl completion fish > ~/.config/fish/completions/dsv4ctl.fish",
}


def completion_text(shell: str) -> str:
    """The shipped completion script for ``shell`` (bash, zsh or fish). InputError for another
    shell or a missing file."""
    from ..errors import InputError
    from ..resources import shipped_dir
    if shell not in FILES:
        raise InputError(f"completion: unknown shell {shell!r} (bash, zsh or fish)")
    path = shipped_dir("completions") / FILES[shell]
    try:
        return path.read_text()
    except OSError as e:
        raise InputError(f"{path}: {e.strerror or e} (the installation is incomplete)") from None


def completion(shell: str = typer.Argument(..., metavar="SHELL", help="bash, zsh or fish.")) -> None:
    """Print the completion script for SHELL on stdout (how to install it: on stderr when stdout
    is not a terminal). Exit 2 for an unknown shell."""
    text = completion_text(shell)
    sys.stdout.write(text)
    if not sys.stdout.isatty() and sys.stderr.isatty():
        print(f"# install: {INSTALL[shell]}", file=sys.stderr)


def register(app: typer.Typer) -> None:
    """Add ``completion``."""
    app.command("completion")(completion)
