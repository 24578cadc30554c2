"""``dsv4ctl exec``: one command on every host and node of a group (every replica), in parallel.

The steps are built once (:func:`exec_steps`: one per host, its exact command from
:func:`dsv4ctl.hosts.execute.exec_command`); ``--dry-run`` prints them as the ``ssh`` command
lines they are (:func:`ssh_line`), the run sends the same text over each host's transport. With
``deploy.backend: slurm`` the group's nodes are the same hosts, reached over SSH the same way.
No deploy lock is taken (a read during a deploy is what exec is for); each host's audit log gets
one line."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError
from ..hosts.execute import exec_command, parse_exec
from ..remote import q, run_parallel
from .site import Site
from .steps import Step


@dataclass(frozen=True)
class Target:
    """One node of the group: ``host``, ``replica`` (0-based), ``rank`` (node rank), ``nnodes``."""

    host: str
    replica: int
    rank: int
    nnodes: int

    @property
    def label(self) -> str:
        """How its output lines are prefixed: the host, ``host/node1`` for node 1 of a multi-node server."""
        return self.host if self.nnodes == 1 else f"{self.host}/node{self.rank}"


def exec_targets(dep, group: str, hosts: list[str] | None = None) -> list[Target]:
    """Every node of every server of ``group`` (the router: its host), replica then rank order;
    ``hosts``: only those (each must run the group: InputError, exit 2, naming the group's hosts)."""
    g = dep.group(group)
    out = [Target(n.host, n.replica, n.node, n.nnodes) for srv in g.server_nodes for n in srv]
    for h in hosts or []:
        if h not in dep.hosts:
            raise InputError(f"--host {h!r}: not a host of {dep.path} ({', '.join(dep.hosts)})")
        if h not in {t.host for t in out}:
            raise InputError(f"--host {h!r}: group {group} does not run there ({', '.join(t.host for t in out)})")
    return [t for t in out if not hosts or t.host in hosts]


def exec_steps(site: Site, group: str, targets: list[Target], words, message: str | None) -> list[Step]:
    """One ``exec`` step per target: its host command (:func:`exec_command`) and summary."""
    from ..hosts.execute import command_text
    return [Step("exec", t.host, f"in {site.paths[t.host].current} as group {group}"
                 + (f" (replica {t.replica}, node {t.rank})" if t.nnodes > 1 or t.replica else "")
                 + f": {command_text(words)}",
                 exec_command(site.paths[t.host], site.python[t.host], group, t.replica, t.rank, words, message, t.host),
                 extra={"label": t.label, "replica": t.replica, "node": t.rank})
            for t in targets]


def ssh_line(host, cmd: str) -> str:
    """The OpenSSH command line that runs ``cmd`` on profile host ``host`` (what the transport
    does over paramiko: its user, port, key, jump host and known_hosts); a local host: ``sh -c``."""
    if getattr(host, "local", False):
        return f"sh -c {q(cmd)}"
    def word(w: str) -> str:          # ~/ stays unquoted: the shell expands it
        return "~/" + q(w[2:]) if w.startswith("~/") else q(w)
    words = ["ssh"] + (["-i", host.key] if host.key else []) + (["-p", str(host.port)] if host.port != 22 else []) \
        + (["-J", host.jump] if host.jump else []) \
        + (["-o", f"UserKnownHostsFile={host.known_hosts}"] if host.known_hosts else []) \
        + [f"{host.user}@{host.address}" if host.user else host.address]
    return " ".join(word(w) for w in words) + " " + q(cmd)


def run_exec(site: Site, steps: list[Step], timeout: float) -> dict:
    """Run ``steps`` on their hosts at once (each at most ``timeout`` s: then its process group
    on the host is stopped). Returns ``{host: entry}``: ``exit_status`` (None: not run),
    ``release``, ``stdout``, ``stderr``, ``not_run``, ``error`` (the host could not be reached or
    the command timed out), ``timed_out``."""
    by_host = {s.host: s for s in steps}

    def one(t):
        res = t.run(by_host[t.name].cmd, timeout=timeout, check=False)
        return parse_exec(res.code, res.out, res.err)
    res = run_parallel({h: site.transports[h] for h in by_host}, one, timeout=timeout + site.opts.connect_timeout + 15)
    out = {}
    for h, r in res.items():
        s = by_host[h]
        e = {"label": s.extra["label"], "replica": s.extra["replica"], "node": s.extra["node"]}
        if not r.ok:
            timed_out = f"timed out after {timeout:g} s" in (r.error or "")
            e.update(exit_status=None, release=None, stdout="", stderr="", not_run=None, error=r.error,
                     timed_out=timed_out)
        else:
            v = r.value
            e.update(exit_status=v.status, release=v.release, stdout=v.stdout, stderr=v.stderr, not_run=v.not_run,
                     error=None, timed_out=False)
        out[h] = e
    return out


def exec_verdict(hosts: dict) -> tuple[int, str | None]:
    """(exit code, one-line reason) of a run's ``hosts`` entries (:func:`run_exec`): 3 when a
    host could not be reached, else 1 when a command failed, did not run or timed out, else 0."""
    down = [f"{h}: {e['error']}" for h, e in hosts.items() if e["error"] and not e["timed_out"]]
    if down:
        return 3, f"{len(down)} host(s) unreachable: {down[0]}"
    bad = [f"{e['label']}: " + ("timed out" if e["timed_out"] else f"not run: {e['not_run']}" if e["not_run"]
                                else f"exit {e['exit_status']}")
           for e in hosts.values() if e["exit_status"] != 0]
    if bad:
        return 1, f"the command failed on {len(bad)} of {len(hosts)} host(s): " + "; ".join(bad)
    return 0, None
