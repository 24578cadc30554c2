"""The systemd unit ``dsv4ctl watch --print unit`` writes: a long-running service for one
profile (pure)."""

from __future__ import annotations

import shlex
import sys

UNIT = """# dsv4ctl watch for profile {profile}
# Install: dsv4ctl watch {profile_q}{args_q} --print unit > {unit_path_q}
#          systemctl daemon-reload && systemctl enable --now {unit_q}
[Unit]
Description=dsv4ctl watch: known-answer tool-call probes for {name_spec}
Documentation=https://github.com/dsv4ctl/dsv4ctl#dsv4ctl-watch--the-gate-that-never-sleeps
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
ExecStart={exec_start}
# SIGTERM stops it cleanly (exit 0); it never changes the deployment without --on-alert ... --auto
KillSignal=SIGTERM
TimeoutStopSec=30
Restart=on-failure
RestartSec=15
# probes hold at most one request per target; the process stays small
MemoryMax=512M
NoNewPrivileges=true
# runs as root unless a drop-in sets User=; DSV4CTL_API_KEY (when the servers need one and no serve
# config holds it) goes into an EnvironmentFile= drop-in, never here (docs/watch.md)
{environment}
[Install]
WantedBy=multi-user.target
"""


def render_unit(profile: str, python: str | None = None, extra_args: tuple[str, ...] = (),
                environment: dict[str, str] | None = None) -> str:
    """A systemd service unit running ``python -m dsv4ctl watch PROFILE`` (``python``: this
    interpreter by default, so the unit runs the dsv4ctl that printed it) with ``extra_args``
    (e.g. ``--listen``); ``environment`` as ``Environment=`` lines (never a secret: use
    ``EnvironmentFile=`` for ``DSV4CTL_API_KEY``). ``profile`` should be an absolute path or a
    shipped name. ValueError for a control character in any word (it would end the ExecStart
    line and start another directive)."""
    import os
    for word in (profile, *extra_args, *(environment or {}).values()):
        if any(ord(c) < 0x20 or c == "\x7f" for c in word):
            raise ValueError(f"{word!r}: a control character (a newline would start another unit line)")
    name = os.path.splitext(os.path.basename(profile))[0] or "default"
    unit = f"dsv4ctl-watch@{systemd_escape(name)}.service"
    argv = [python or sys.executable, "-m", "dsv4ctl", "watch", profile, *extra_args]
    env = "".join(f"Environment={shlex.quote(k + '=' + v)}\n" for k, v in (environment or {}).items())
    return UNIT.format(profile=profile, profile_q=shlex.quote(profile), name=name, name_spec=name.replace("%", "%%"),
                       unit_q=shlex.quote(unit), unit_path_q=shlex.quote("/etc/systemd/system/" + unit),
                       args_q="".join(" " + shlex.quote(a) for a in extra_args),
                       exec_start=" ".join(_systemd_quote(a) for a in argv), environment=env)


def systemd_escape(text: str) -> str:
    """``text`` as a unit-name instance, escaped as ``systemd-escape`` does: ``/`` → ``-``,
    every byte outside ``[A-Za-z0-9:_.]`` (and a leading ``.``) → ``\\xNN``."""
    out = []
    for i, b in enumerate(text.encode()):
        c = chr(b)
        if c == "/":
            out.append("-")
        elif (c.isascii() and (c.isalnum() or c in ":_.")) and not (i == 0 and c == "."):
            out.append(c)
        else:
            out.append(f"\\x{b:02x}")
    return "".join(out) or "default"


def _systemd_quote(word: str) -> str:
    """One ExecStart word: plain when safe, else double-quoted with systemd's escapes."""
    if word and all(c.isalnum() or c in "/._-:=@+," for c in word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$").replace("%", "%%") + '"'
