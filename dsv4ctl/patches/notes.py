"""Why a ``patch apply`` / ``patch revert`` was run (``-m``): a git note on every commit it made,
under ``refs/notes/dsv4ctl`` (the commits themselves are not changed: their ids and patch ids stay
what the series and ``patch status`` compare). ``git log --notes=dsv4ctl`` and ``patch status``
show them."""

from __future__ import annotations

from .gitio import Git

NOTES_REF = "dsv4ctl"       # refs/notes/dsv4ctl


def note_text(command: str, message: str, who: str) -> str:
    """The note of one commit: ``patch apply by root@vm: why`` (one line)."""
    return f"{command} by {who}: {message}"


def note_command(text: str) -> str:
    """The command a dry run prints for the notes (run once per new commit)."""
    import shlex
    return f"git notes --ref={NOTES_REF} add -f -m {shlex.quote(text)} COMMIT   (each new commit)"


def add_notes(git: Git, commits: list[str], text: str) -> None:
    """Attach ``text`` to each of ``commits`` (full ids) as a dsv4ctl note (replacing one there).
    DsvError (exit 3 on a remote tree, as every git failure here) naming the tree."""
    for sha in commits:
        git.run("notes", f"--ref={NOTES_REF}", "add", "-f", "-m", text, sha, config=git.identity_config())


def read_notes(git: Git, commits: list[str]) -> dict[str, str]:
    """{commit: its dsv4ctl note, stripped} of those of ``commits`` that have one."""
    out = {}
    for sha in commits:
        r = git.run("notes", f"--ref={NOTES_REF}", "show", sha, check=False)
        if r.code == 0 and r.out.strip():
            out[sha] = r.out.strip()
    return out
