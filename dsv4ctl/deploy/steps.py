"""Steps of deploy, rollback and promote: the builders that turn a site's facts into the exact list
a run executes. ``--dry-run`` prints this list (``-v``: with every command); the engine executes
the same list, built by the same functions, and nothing else builds a host command of these runs.

A :class:`Step` is one thing done on one host (or one HTTP probe, or one local check child):

* ``lock``   ``mkdir <root>/.lock`` with ``holder.json``, plus the host's facts in the same round trip;
* ``push``   the release into ``releases/.incoming-<id>``, verified and renamed on the host
  (:mod:`dsv4ctl.deploy.push`; its rsync/tar and verify commands are that one step);
* ``verify`` the release a switch will activate, already on the host, hashed against its
  manifest (:mod:`dsv4ctl.deploy.drift`: catches an in-place edit of a shared hard link);
* ``switch`` stop the host's groups (old and new), re-point ``previous``/``current``, start the
  new release's groups — one shell command;
* ``gate``   ``GET /health`` of a worker, ``POST /v1/chat/completions`` through the router;
* ``check``  a ``dsv4ctl check`` child (promote);
* ``close``  prune, one audit line (its ``ts`` is the host's clock when it runs), state.json
  (atomic; the document on stdin), unlock — one shell command.

Commands hold no value that changes between building and running (the audit time is taken on
the host), so a run's executed commands are exactly its listed ones (tests/test_steps_equal.py)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from ..hosts.audit import append_cmd, now_iso, record_fields
from ..hosts.layout import HostFacts, Paths, claim_cmd, facts_command, kept_after_prune, owner_doc, select_prune
from ..hosts.lock import holder, holder_text, release_cmd, take_cmd
from ..profile.deployment import http_url
from ..remote import atomic_write_cmd, q
from .service import gate_step_text, service_for
from .site import Site, health_timeout, host_groups, link_bases, spec_servers, start_command


#: The lock token a dry run shows (a run's is random, 16 hex digits).
DRY_RUN_TOKEN = "dry-run"


@dataclass(frozen=True)
class Step:
    """One step. ``host``: the host it runs on (a gate step: the group's host; a check: ``local``);
    ``cmd``: the exact command (a host's shell command; ``GET url`` / ``POST url`` for a gate
    probe; the argv of a check child); None for a push (see the module docstring)."""

    phase: str
    host: str
    summary: str
    cmd: str | None = None
    stage: str = ""
    extra: dict = field(default_factory=dict, compare=False)   # what the engine needs besides cmd

    def line(self, verbose: bool = False) -> str:
        """``host: [stage] summary``; with ``verbose`` the command follows, indented."""
        s = f"{self.host}: " + (f"[{self.stage}] " if self.stage else "") + self.summary
        if verbose and self.cmd:
            s += "\n    $ " + self.cmd.replace("\n", "\n      ")
        return s

    def to_dict(self) -> dict:
        return {"phase": self.phase, "host": self.host, "stage": self.stage, "summary": self.summary,
                "cmd": self.cmd}


_ENV_WORD = __import__("re").compile(r"(?P<pre>(?:^|[\s'\"=]))(?P<key>[A-Za-z_][A-Za-z0-9_]*)=(?P<val>[^\s'\"]+)")
_AUTH_HEADER = __import__("re").compile(r"(?i)(?P<head>\bauthorization\\?[\"']?\s*[:=]\s*\\?[\"']?(?:(?:bearer|basic|token)\s+)?)"
                                        r"(?P<val>[^\s\"',;}\]\\]+)")
# a scheme is tried only where a run of scheme characters starts (its first letter: the match the
# leftmost search found), so a long word is scanned once, not once per letter (quadratic: a 100 kB
# line of exec output took 70 s)
_URL_USERINFO = __import__("re").compile(r"(?<![A-Za-z0-9+.-])(?P<scheme>[0-9+.-]*[A-Za-z][A-Za-z0-9+.-]*://)"
                                         r"(?P<user>[^\s:/@'\"]*):(?P<pw>[^\s/@'\"]+)@")
_FLAG = __import__("re").compile(r"--(?P<key>[A-Za-z0-9-]+)(?:=|\s+)(?P<val>'[^']*'|\"[^\"]*\"|[^\s'\"]+)")


def deployment_secrets(dep) -> set[str]:
    """Values no output may show, from the Deployment: env values under secret-looking names
    (``HF_TOKEN``, ``*_API_KEY``, …), secret serve-config values (``api-key``, …, also inside JSON
    strings), the values of secret flags in launch templates (``--api-key X``) and the password of
    every URL in ``sglang.environment.uv_args`` (``https://user:PASSWORD@index/simple``)."""
    from ..profile.secrets import is_secret_key, secret_strings
    import os
    out: set[str] = set()
    if len(os.environ.get("DSV4CTL_API_KEY", "")) >= 4:
        out.add(os.environ["DSV4CTL_API_KEY"])
    for g in dep.groups.values():
        out |= secret_strings(g.env)
        if g.serve_config_path is not None and g.serve_config_path.is_file():
            from ..serve.edit import secret_values
            out |= secret_values(g.serve.data)
        for m in _FLAG.finditer(g.launch_template):
            if is_secret_key(m.group("key")):
                out.add(m.group("val").strip("'\""))
    env = dep.sglang.environment
    for a in (env.uv_args if env is not None else ()):
        out |= {m.group("pw") for m in _URL_USERINFO.finditer(a)}
    return secret_spellings(x for x in out if len(x) >= 4)


def secret_spellings(values) -> set[str]:
    """Every way a secret value can show up in output: as written, shell-quoted, JSON-escaped (once
    and twice)."""
    import json
    spelled: set[str] = set()
    for s in values:
        spelled |= {s, s.replace("'", "'\"'\"'"), json.dumps(s)[1:-1], json.dumps(json.dumps(s)[1:-1])[1:-1]}
    return spelled


def mask_secrets(text: str, secrets: set[str] = frozenset()) -> str:
    """``text`` with every known secret value (:func:`deployment_secrets`) replaced by ``***``,
    and, as a second net, the value of every ``NAME=value`` word or ``--flag value`` whose name
    looks secret (:func:`dsv4ctl.profile.serveconfig.is_secret_key`), the credentials of every
    ``Authorization: [Bearer|Basic] X`` (also ``"authorization": "Bearer X"``: a header a server
    echoes) and the password of every ``scheme://user:password@host`` URL."""
    from ..profile.secrets import is_secret_key
    from ..serve.edit import MASK, scrub
    text = scrub(text, set(secrets))
    text = _URL_USERINFO.sub(lambda m: m.group(0)[:m.start("pw") - m.start()] + MASK + "@", text)
    text = _AUTH_HEADER.sub(lambda m: m.group("head") + MASK, text)
    text = _ENV_WORD.sub(lambda m: m.group(0) if not is_secret_key(m.group("key"))
                         else f"{m.group('pre')}{m.group('key')}={MASK}", text)
    return _FLAG.sub(lambda m: m.group(0) if not is_secret_key(m.group("key"))
                     else m.group(0)[:m.start("val") - m.start()] + MASK, text)


def site_secrets(site: Site) -> set[str]:
    """:func:`deployment_secrets` of the site's Deployment, computed once per run."""
    if site.secrets is None:
        site.secrets = deployment_secrets(site.profile)
    return site.secrets


def listing(steps: list[Step], verbose: bool = False) -> list[str]:
    """The lines ``--dry-run`` prints for ``steps`` (in order)."""
    return [s.line(verbose) for s in steps]


# -- switch ------------------------------------------------------------------------------------

def switch_cmd(p: Paths, rid: str | None, prev: str | None) -> str:
    """Atomic switch: ``previous`` then ``current`` re-pointed by rename of a fresh symlink
    (``rid`` None removes ``current``: nothing was active before the first deploy)."""
    parts = [f"cd {q(p.root)}"]
    if prev:
        parts.append(f"ln -sfn releases/{q(prev)} .previous.tmp && mv -T .previous.tmp previous")
    else:
        parts.append("rm -f previous")
    if rid:
        parts.append(f"ln -sfn releases/{q(rid)} .current.tmp && mv -T .current.tmp current")
    else:
        parts.append("rm -f current")
    return " && ".join(parts)


def stop_groups(spec: dict | None, stop_spec: dict | None, host: str) -> list[str]:
    """Groups the switch of ``host`` stops: those of the running release (``stop_spec``) and of
    the new one (``spec``), the router first (it stops taking requests before its workers go)."""
    spec, stop_spec = spec or {}, stop_spec or {}
    stop = set(host_groups(stop_spec, host)) | set(host_groups(spec, host))
    role = lambda g: (spec.get(g) or stop_spec.get(g) or {}).get("role")  # noqa: E731
    return sorted(stop, key=lambda g: (role(g) != "router", g))


def activate_cmd(site: Site, host: str, rid: str | None, prev: str | None,
                 spec: dict | None, stop_spec: dict | None, restart: frozenset | None = None) -> str:
    """One shell command: stop :func:`stop_groups`, switch ``current``/``previous`` atomically,
    start the groups of ``spec`` (servers first). ``restart``: only these groups are stopped and
    started (a serve-config change; the others keep running, their files are the same inodes)."""
    p = site.paths[host]
    svc = service_for(site, host, spec, stop_spec)
    stops, starts, submits = _acts(svc, spec, stop_spec, host, rid, restart)
    parts = [svc.stop_cmd(p, g) for g in stops]
    parts.append(switch_cmd(p, rid, prev))
    for g in starts:
        s_ = spec[g]
        # a group this host only submits for (a Slurm submit host) has no launch command here
        cmd = "" if g in submits else start_command(site, host, rid, g, s_)
        parts.append(svc.start_cmd(p, g, rid, cmd, s_.get("env", {})))
    return " && ".join(f"( {x} )" for x in parts)


def _acts(svc, spec: dict | None, stop_spec: dict | None, host: str, rid: str | None,
          restart: frozenset | None) -> tuple[list[str], list[str], set]:
    """(groups the switch of ``host`` stops, groups it starts, groups among them that ``host``
    only submits for: a Slurm submit host, :meth:`~dsv4ctl.deploy.slurmjobs.SlurmJobs.acted_groups`)."""
    spec, stop_spec = spec or {}, stop_spec or {}
    acted = getattr(svc, "acted_groups", lambda gs: [])
    submits = set(acted(sorted(set(spec) | set(stop_spec))))
    stops = [g for g in stop_groups(spec, stop_spec, host) + sorted(submits) if restart is None or g in restart]
    starts = ([g for g in host_groups(spec, host) + sorted(submits & set(spec)) if restart is None or g in restart]
              if rid else [])
    return stops, starts, submits


def next_previous(f: HostFacts, rid: str) -> str | None:
    """What ``previous`` points at after switching the host of ``f`` to ``rid``: the current
    release, unless it is ``rid`` itself (then ``previous`` stays)."""
    return f.current if f.current and f.current != rid else f.previous


def switch_step(site: Site, host: str, rid: str | None, prev: str | None, spec: dict | None,
                stop_spec: dict | None, stage: str = "", frm: str | None = "",
                restart: frozenset | None = None) -> Step:
    """The switch of ``host`` to ``rid`` (None: remove ``current``) with ``previous`` -> ``prev``;
    ``frm``: what ``current`` points at then (default: what the facts say); ``restart``: only
    these groups are restarted (None: every group of both releases on the host)."""
    f, p = site.facts[host], site.paths[host]
    frm = f.current if frm == "" else frm
    svc = service_for(site, host, spec, stop_spec)
    stops, starts, _ = _acts(svc, spec, stop_spec, host, rid, restart)
    summary = (f"switch {p.current}{site.shared_note(host)}: {frm or '(none)'} -> {rid or '(none)'} "
               f"(previous -> {prev or '(none)'})"
               + (f"; stop {', '.join(stops)}" if stops else "")
               + (f"; start {', '.join(starts)} ({svc.name})" if starts else ""))
    if restart is not None and not stops and not starts:
        summary += "; no group restarted"
    return Step("switch", host, summary, activate_cmd(site, host, rid, prev, spec, stop_spec, restart), stage,
                extra={"rid": rid, "prev": prev})


# -- gate --------------------------------------------------------------------------------------

def gate_targets(site: Site, spec: dict, hosts: list[str] | None = None) -> tuple[list, list, str]:
    """([(host, group, url, nodes)] workers, [(host, group, url, nodes)] chat targets, model) of
    a launch spec: workers are the servers (every replica; a multi-node server at its node 0, the
    only node that serves HTTP, with ``nodes`` its other hosts, whose processes must stay alive);
    chat goes through the router group(s), else through the decode/colocated servers. ``hosts``:
    only servers whose node 0 is on these hosts (a promotion canary: every node of a server is in
    it or none, :func:`dsv4ctl.deploy.promote.choose_canary`); always only those of the site's
    hosts (a limited deploy: :mod:`dsv4ctl.deploy.limit`)."""
    workers, routers = [], []
    order = {h: i for i, h in enumerate(site.nodes)}
    rows = [(srv[0], g, r, srv[1:]) for g, s in spec.items()
            for r, srv in enumerate(spec_servers(s))]
    for h, g, _r, nodes in sorted(rows, key=lambda x: (order.get(x[0], len(order)), x[1], x[2])):
        if hosts is not None and h not in hosts or h not in order:
            continue
        tgt = (h, g, http_url(site.profile.hosts[h].address, spec[g]["port"]), list(nodes))
        (routers if spec[g]["role"] == "router" else workers).append(tgt)
    chat = routers or [w for w in workers if spec[w[1]]["role"] in ("decode", "colocated")]
    model = next((spec[c[1]]["model"] for c in chat), "default")
    return workers, chat, model


def gate_steps(site: Site, spec: dict, hosts: list[str] | None = None, stage: str = "") -> list[Step]:
    """The health gate of ``spec`` (see :func:`dsv4ctl.hosts.health.gate`): every worker's
    ``/health`` (a multi-node server's node 0, its other nodes' processes alive), then one 1-token
    chat completion per chat target."""
    workers, chat, model = gate_targets(site, spec, hosts)
    t = health_timeout(site)

    def alive(nodes):
        return f", processes alive on {', '.join(nodes)}" if nodes else ""

    out = [Step("gate", h, gate_step_text(site, spec, g, f"wait for GET {u}/health = 200 (group {g}{alive(n)}, "
                                                          f"timeout {t:g} s)"),
                f"GET {u}/health", stage, extra={"group": g, "url": u, "kind": "health", "nodes": n})
           for h, g, u, n in workers]
    out += [Step("gate", h, f"POST {u}/v1/chat/completions (model {model}, max_tokens 1, group {g}) "
                            "once the workers are healthy", f"POST {u}/v1/chat/completions", stage,
                 extra={"group": g, "url": u, "kind": "chat", "model": model, "nodes": n})
            for h, g, u, n in chat]
    return out


# -- lock, push, close -------------------------------------------------------------------------

def lock_step(site: Site, host: str, what: str) -> Step:
    """Take ``host``'s lock (its holder carries ``site.token``) and read its facts in the same
    round trip; with ``--break-lock`` a held lock is removed first, audited with its holder (as
    the facts read before it say)."""
    p, f = site.paths[host], site.facts.get(host)
    pre = ""
    summary = f"lock {p.lock}{site.shared_note(host)}"
    if site.opts.break_lock:
        old = holder_text(f.lock) if f is not None and f.lock else "unknown holder"
        rec = record_fields(host, "break-lock", "ok", f"removed lock held by {old}")
        pre = f"if [ -d {q(p.lock)} ]; then rm -rf {q(p.lock)} && {append_cmd(p.audit, rec)}; fi; "
        summary += " (breaking the current lock first)"
    # the first run that takes a root records its profile as the root's owner (owner.json)
    claim = claim_cmd(p.root, owner_doc(site.profile.name, site.profile.path))
    cmd = (f"{pre}mkdir -p {q(p.releases)} && "
           + take_cmd(p.lock, holder(what, site.token), f"{claim}; {facts_command(p.root)}"))
    return Step("lock", host, summary, cmd)


def push_step(site: Site, host: str, rid: str, stage: str = "") -> Step:
    """Push ``rid`` to ``host`` (or say it is already there)."""
    from .push import use_rsync
    f, p = site.facts[host], site.paths[host]
    if rid in f.releases:
        return Step("push", host, f"release {rid} already present: no push", None, stage)
    bases = link_bases(f, rid)
    how = "rsync" if use_rsync(f) else "hard-link copy + changed files (tar)"
    return Step("push", host, f"push {rid} to {p.incoming(rid)}{site.shared_note(host)} with {how}"
                              + (f", reusing {', '.join(bases)}" if bases else "")
                              + f"; verify the manifest on the host, rename to {p.release(rid)}", None, stage)


def verify_step(site: Site, host: str, rid: str, stage: str = "") -> Step:
    """Check every file of ``rid`` (on ``host`` already) against its manifest before a switch to it,
    reading a file unless the host's hash cache has its identity (:mod:`dsv4ctl.deploy.drift`;
    the script and its job on stdin are that one step)."""
    return Step("verify", host, f"verify {site.paths[host].release(rid)}{site.shared_note(host)} against its "
                                "MANIFEST.json (every file's "
                                "hash; read unless its inode, size, mtime and ctime are in the host's hash cache; "
                                "drift stops the run before any switch)", None, stage, extra={"rid": rid})


def spec_environment(spec: dict | None) -> str | None:
    """The environment digest a release's launch spec names (``python_env``), None without one."""
    return next((s.get("python_env") for s in (spec or {}).values() if s.get("python_env")), None)


def env_steps(site: Site, rid: str, spec: dict, hosts: list[str] | None = None, stage: str = "") -> list[Step]:
    """One step per host building the Python environment release ``rid`` runs on (its launch
    spec ``spec`` names the digest) from the release's own ``environment.lock``, before its
    verify: :func:`dsv4ctl.deploy.environment.build_command` (nothing to do when the host has
    it: the command checks). No steps for a release without an environment, nor for a release
    image (the environment is a layer of the image: :func:`dsv4ctl.deploy.image.env_image`)."""
    from .environment import LOCK_NAME, build_command
    from .image import spec_image
    digest = spec_environment(spec)
    if digest is None or spec_image(spec):
        return []
    env = site.profile.sglang.environment
    uv, uv_args = (env.uv, env.uv_args) if env is not None else ("uv", ())
    out = []
    for h in hosts or site.hosts:
        p = site.paths[h]
        cmd = build_command(p.root, digest, f"{p.release(rid)}/{LOCK_NAME}", uv=uv, python=site.python[h],
                            uv_args=uv_args)
        what = (f"environment {digest} present ({p.env(digest)})" if digest in site.facts[h].envs else
                f"build environment {digest} at {p.env(digest)} from {rid}'s {LOCK_NAME} (uv venv + uv pip sync "
                "--require-hashes; read-only, renamed into place)")
        out.append(Step("env", h, what, cmd, stage, extra={"digest": digest, "rid": rid}))
    return out


def image_steps(site, rid: str, spec: dict, stage: str = "") -> list:
    """The build (on ``local``) and the ship to every host of release ``rid``'s image: what a
    deploy runs after the push and before the verify (nothing without containers in ``spec``)."""
    from ..hosts.container import IMAGE_NAME, pool_dir
    from .image import host_devices, spec_image
    if not spec_image(spec):
        return []
    img = site.profile.sglang.image
    base = next(s["container"]["base"] for s in spec.values() if "container" in s)
    reg = img.registry if img else None
    env = " on its environment layer (built once per lock)" if any(s.get("python_env") for s in spec.values()) else ""
    bh = img.build_host if img else None
    where = (f" on build host {bh} (the build context sent with rsync to {site.profile.host_root(bh)}/images/build)"
             if bh else "")
    out = [Step("image", "local", f"build image {IMAGE_NAME}:{rid} FROM {base}{env}{where} (tree layer, serve "
                                  "configs + launch spec layer; podman build --timestamp 0), "
                                  + (f"push it to {reg}{' from ' + bh if bh else ''} (credentials: the auth file)"
                                     if reg else f"bring its OCI layout back from {bh} (the blobs this machine lacks)"
                                     if bh else "save it as an OCI layout"), None, stage)]
    for h in site.hosts:
        root = site.paths[h].root
        devs = host_devices(spec, h)
        how = (f"pull it from {reg} (credentials on stdin)" if reg else
               f"send the blobs {pool_dir(root)} lacks (rsync), pull oci:{pool_dir(root)}")
        out.append(Step("image", h, f"ship image of {rid}: check {img.runtime if img else 'podman'}"
                                    + (f" and CDI devices {', '.join(devs)}" if devs else "")
                                    + f", {how}, check the image id, record it in {root}/images/ids/{rid}", None, stage,
                        extra={"rid": rid}))
    return out


def local_prune_steps(site, rid: str, spec: dict, closes: list) -> list:
    """The ``image-prune`` step after the close steps ``closes`` (each with its ``prune`` list):
    one ``local`` step naming the releases whose copies on the control machine go
    (:func:`dsv4ctl.deploy.image.prune_local` runs it); [] without containers in ``spec`` or
    when none goes."""
    from pathlib import Path
    from .image import local_prune_ids, local_store, spec_image
    from .release import default_cache
    ids = local_prune_ids(site, rid, {s.host: s.extra.get("prune", []) for s in closes}) if spec_image(spec) else []
    if not ids:
        return []
    st = local_store(Path(site.opts.cache or default_cache()))
    return [Step("image-prune", "local", f"prune this machine's copies of {', '.join(ids)} (no host keeps them): "
                                         f"their OCI layouts {st}/oci/<release>, images and records, and "
                                         "environment images no kept release is built on", extra={"ids": ids})]


def image_verify_steps(site, rid: str, spec: dict, stage: str = "") -> list:
    """One verify step per host of release ``rid``'s image (nothing without containers)."""
    from .image import spec_image
    if not spec_image(spec):
        return []
    return [Step("verify", h, f"verify the image of {rid}: the recorded id is the built one, the release inside it "
                              "(mounted read-only) hashed against its MANIFEST.json", None, stage,
                 extra={"rid": rid, "image": True}) for h in site.hosts]


def present_verify_steps(site: Site, rid: str, stage: str = "", spec: dict | None = None) -> list[Step]:
    """Verify steps for the hosts that already hold ``rid`` (a push verifies the tree it places);
    for every host when ``rid`` runs on an environment (``spec`` names one): a pushed release may
    land on an environment built before (shared by releases of one lock), judged only here."""
    every = spec_environment(spec) is not None
    return [verify_step(site, h, rid, stage) for h in site.hosts if every or rid in site.facts[h].releases]


def incoming_rm(p: Paths, rid: str) -> str:
    """Shell: remove ``.incoming-<rid>`` and its ``.delta-*`` side folders."""
    return f"rm -rf {q(p.incoming(rid))} {q(p.incoming(rid))}.delta-*"


def close_cmd(site: Site, host: str, record: dict, prune: list[str], cleanup: str | None) -> str:
    """Shell: remove ``cleanup``'s incoming folders, delete the ``prune`` releases, then append
    ``record`` to the audit log (first: a full disk must not leave a state.json that no audit line
    explains) and write state.json from stdin (atomic; :func:`dsv4ctl.remote.ops.framed`: a cut
    stream is refused) — each tried whatever the other did —, then drop this run's lock whatever
    failed before. Exits with the first failure's status (a failed append included; a failed
    write leaves the old state.json intact)."""
    p = site.paths[host]
    parts = []
    if cleanup:
        parts.append(incoming_rm(p, cleanup))
    for r in prune:
        trash = p.releases + "/.trash-" + r
        parts.append(f"mv -T {q(p.release(r))} {q(trash)} && rm -rf {q(trash)}")
    if prune:
        from .environment import gc_command
        parts.append(gc_command(p.root))
        if site.profile.sglang.image is not None:      # the images no kept release names
            from ..hosts.container import gc_images_cmd
            parts.append(gc_images_cmd(site.profile.sglang.image, p.root))
    state = atomic_write_cmd(p.state, size=None)     # stdin: framed(state document)
    audit = append_cmd(p.audit, record)
    # the record and the state are written only when the clean-up and pruning worked (the state
    # document on stdin drops the pruned releases); the lock is released whatever failed before
    # (a full disk must not leave the host locked); the exit status is the first failure's
    return (f"(rc=0; {{ {' && '.join(parts) or 'true'}; }} || rc=$?; "
            f"if [ $rc -eq 0 ]; then {audit} || rc=$?; {state} || {{ s=$?; [ $rc -ne 0 ] || rc=$s; }}; fi; "
            f"{release_cmd(p.lock, site.token)}; exit $rc)")


def close_step(site: Site, host: str, record: dict, *, event: tuple | None = None, prune: list[str] = (),
               cleanup: str | None = None) -> Step:
    """The last round trip on ``host``. ``record``: audit fields (action, result, detail, …; the
    host and operator are added); ``event``: ``(release id, event, info)`` the close applies to the
    release's state (:func:`dsv4ctl.deploy.states.transition`; the listing names the outcome).
    The run's ``-m`` message (``Options.message``) is in every record that does not carry one."""
    from .states import next_state
    if getattr(site.opts, "message", None) and "message" not in record:
        record = {**record, "message": site.opts.message}
    if isinstance(record.get("detail"), str):   # server log lines and HTTP bodies may echo a secret
        record = {**record, "detail": mask_secrets(record["detail"], site_secrets(site))}
    rec = record_fields(host, **record)
    if prune or "pruned" in record:
        rec["pruned"] = list(prune)
        f = site.facts[host]
        rid_new = event[0] if event is not None else None
        rec["kept"] = ([rid_new] if rid_new and rid_new not in f.releases else []) + kept_after_prune(f, list(prune))
    marks = ""
    if event is not None:
        rid, ev = event[0], event[1]
        marks = f"{rid} {next_state(site.facts[host].state.get('releases', {}).get(rid), ev, site.opts.force_failed)}"
    summary = ("close: " + (f"mark {marks}; " if marks else "")
               + (f"prune {', '.join(prune)} (and environments no release left uses); " if prune else "")
               + (f"remove {site.paths[host].incoming(cleanup)}; " if cleanup else "")
               + f"audit {record['action']} {record['result']}; unlock")
    return Step("close", host, summary, close_cmd(site, host, rec, list(prune), cleanup),
                extra={"prune": list(prune), "record": rec, "event": event})


def prune_after_switch(f: HostFacts, rid: str, keep: int) -> list[str]:
    """Releases the close-out deletes on the host of ``f`` once ``rid`` is active there: beyond
    ``keep``, failed ones first, never current/previous nor the newest good release
    (:func:`select_prune` on the facts as they will be)."""
    g = copy.deepcopy(f)
    g.releases.setdefault(rid, {"id": rid})
    g.previous, g.current = next_previous(f, rid), rid
    g.state.setdefault("releases", {}).setdefault(rid, {}).update(state="active", activated_at=now_iso())
    return select_prune(g, keep)


# -- whole runs --------------------------------------------------------------------------------

@dataclass
class RunSteps:
    """A run's steps: ``steps`` in order (the success path), ``on_failure`` what a failed gate or
    an interrupt runs instead of the rest (the switched hosts put back, the release marked)."""

    steps: list[Step]
    on_failure: list[Step]
    notes: list[str] = field(default_factory=list)     # printed first (why the steps are what they are)

    def lines(self, verbose: bool = False) -> list[str]:
        out = list(self.notes) + listing(self.steps, verbose)
        if self.on_failure:
            out.append("on a failed gate, check or an interrupt, instead (the hosts that switched):")
            out += ["  " + ln for ln in listing(self.on_failure, verbose)]
        return out

    def of(self, phase: str, stage: str | None = None) -> list[Step]:
        return [s for s in self.steps if s.phase == phase and (stage is None or s.stage == stage)]


def nothing_to_do(site: Site, rid: str) -> bool:
    """True when ``rid`` already runs on every host as a complete release (its MANIFEST.json and
    RELEASE.json there: a folder missing one is pushed again) and its record says it passed its
    health gate there (``active`` or ``good``)."""
    return all(site.facts[h].current == rid and rid in site.facts[h].releases
               and site.facts[h].recorded(rid) in ("active", "good") for h in site.hosts)


def converge_detail(servers: list[Step]) -> str:
    """``started G on H, ...`` for the start/stop steps of a converging deploy ('' for none)."""
    starts = [s.extra["started"] for s in servers if s.phase == "start"]
    return ("started " + "; ".join(starts)) if starts else ""


def revert_steps(site: Site, hosts: list[str], rid: str, spec: dict, stage: str = "",
                 restart: frozenset | None = None) -> list[Step]:
    """Put ``hosts`` back from ``rid`` onto the release (and ``previous``) they run now."""
    out = []
    for h in hosts:
        f = site.facts[h]
        out.append(switch_step(site, h, f.current, f.previous, f.current_launch, spec, stage, frm=rid, restart=restart))
    return out


def deploy_steps(site: Site, rid: str, spec: dict, *, locked: bool = True, extra: dict | None = None,
                 action: str = "deploy", restart: frozenset | None = None, lock_what: str | None = None,
                 servers: list[Step] | None = None) -> RunSteps:
    """Every step of ``deploy`` of ``rid`` (launch spec ``spec``) from the hosts' facts. With
    ``locked`` the lock steps are left out (they ran already: the facts came with the locks);
    ``extra``: audit fields every close record carries (a forced run). A serve-config change
    (``hicache on|off --remote``) is the same run with its ``action`` and only the groups in
    ``restart`` restarted. ``servers``: when ``rid`` is already active everywhere, the steps that
    start its servers that are not running (:mod:`dsv4ctl.deploy.servers`), then gated."""
    extra = extra or {}
    hosts = site.hosts
    locks = [] if locked else [lock_step(site, h, lock_what or f"{action} {rid}") for h in hosts]
    if nothing_to_do(site, rid):
        started = converge_detail(servers or [])
        return RunSteps(locks + env_steps(site, rid, spec) + present_verify_steps(site, rid, spec=spec) + list(servers or [])
                        + (gate_steps(site, spec) if servers else []) + [
            close_step(site, h, {"action": action, "release": rid, **extra, "result": "ok",
                                 "detail": "already active" + (f"; {started}" if started else ""),
                                 "from": rid}) for h in hosts],
            [Step("close", h, f"close: audit {action} failed with the reason (the started servers are left as they "
                              "are: the release was already active); unlock") for h in hosts] if servers else [])
    keep = site.profile.deploy.keep_releases
    steps = (locks + [push_step(site, h, rid) for h in hosts] + env_steps(site, rid, spec) + image_steps(site, rid, spec)
             + present_verify_steps(site, rid, spec=spec) + image_verify_steps(site, rid, spec))
    steps += [switch_step(site, h, rid, next_previous(site.facts[h], rid), spec, site.facts[h].current_launch,
                          restart=restart) for h in hosts]
    steps += gate_steps(site, spec)
    steps += [close_step(site, h, {"action": action, "release": rid, **extra, "result": "ok", "detail": "",
                                   "from": site.facts[h].current},
                         event=(rid, "healthy", {"message": extra["message"]} if extra.get("message") else {}),
                         prune=prune_after_switch(site.facts[h], rid, keep))
              for h in hosts]
    steps += local_prune_steps(site, rid, spec, [s for s in steps if s.phase == "close"])
    fail = revert_steps(site, hosts, rid, spec, restart=restart)
    fail += [Step("close", h, f"close: mark {rid} failed with the reason; audit {action} rolled-back (or "
                              "interrupted); unlock") for h in hosts]
    return RunSteps(steps, fail)


def rollback_steps(site: Site, target: str, spec: dict, *, locked: bool = True, extra: dict | None = None,
                   restart: frozenset | None = None) -> RunSteps:
    """Every step of ``rollback`` to ``target`` (its launch spec ``spec``, read from the hosts);
    ``restart``: only these groups are restarted (None: every group)."""
    extra = extra or {}
    hosts = site.hosts
    steps = [] if locked else [lock_step(site, h, f"rollback to {target}") for h in hosts]
    steps += env_steps(site, target, spec)
    steps += [verify_step(site, h, target) for h in hosts]
    steps += image_verify_steps(site, target, spec)        # the image is on the hosts: nothing is rebuilt
    steps += [switch_step(site, h, target, next_previous(site.facts[h], target), spec, site.facts[h].current_launch,
                          restart=restart) for h in hosts]
    steps += gate_steps(site, spec)
    steps += [close_step(site, h, {"action": "rollback", "release": target, **extra, "result": "ok", "detail": "",
                                   "from": site.facts[h].current}, event=(target, "healthy", {}))
              for h in hosts]
    fail = revert_steps(site, hosts, target, spec, restart=restart)
    fail += [Step("close", h, "close: audit rollback failed (or interrupted) with the reason; unlock") for h in hosts]
    return RunSteps(steps, fail)
