"""Measured memory inputs of a group from nvidia-smi (pure; the fact itself is
:mod:`dsv4ctl.hosts.gpus`: one read-only command and its parser).

``free_gib_before_load`` (P, reference §3.2) is what a rank has free after its CUDA context and
NCCL set-up, before weights load. On an idle GPU nvidia-smi's ``memory.free`` already excludes the
driver's reserved memory (H200 fixture: 616 MiB, ``nvidia-smi -q -d MEMORY``), so
P = ``memory.free`` - :data:`CONTEXT_GIB`, the CUDA context + NCCL buffers of a rank (B200:
179.06 GiB total - 0.6 GiB reserved - 177.0 GiB free before load = 1.46 GiB, ⚠ estimate; the
plan's :data:`~dsv4ctl.plan.plan.PRELOAD_USED_GIB` is the same figure counted from the total).
Units: MiB as nvidia-smi prints, GiB (2**30 B) for the plan inputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..hosts.gpus import Gpu
from .verdict import unbalanced

CONTEXT_GIB = 1.46


@dataclass
class GroupFacts:
    """One group's GPUs as measured: per GPU (in the group's ``gpus`` order) the nvidia-smi row,
    the derived P, and the notes an operator must read before using them."""

    group: str
    host: str
    gpus: list[Optional[Gpu]]
    free_gib_before_load: list[Optional[float]]
    notes: list[str] = field(default_factory=list)
    places: list[tuple[str, int]] = field(default_factory=list)   # (host, GPU index) per value

    @property
    def multi_host(self) -> bool:
        return len({h for h, _ in self.places}) > 1

    def gpu_name(self, i: int) -> str:
        """``GPU 3`` (one host) or ``GPU 3 of h200-1`` for the ``i``-th value."""
        h, idx = self.places[i]
        return f"GPU {idx} of {h}" if self.multi_host else f"GPU {idx}"

    def to_dict(self) -> dict:
        return dict(group=self.group, host=self.host, hosts=list(dict.fromkeys(h for h, _ in self.places)),
                    places=[dict(host=h, gpu=i) for h, i in self.places],
                    gpus=[g.as_dict() if g else None for g in self.gpus],
                    memory=dict(free_gib_before_load=self.free_gib_before_load), notes=self.notes)


def group_facts(group: str, host: str, indices: list[int], gpus: list[Gpu], tp: int = 2) -> GroupFacts:
    """:func:`server_facts` of a group on one host."""
    return server_facts(group, [(host, i) for i in indices], {host: gpus}, tp)


def server_facts(group: str, places: list[tuple[str, int]], gpus: dict[str, list[Gpu]], tp: int = 2,
                 server_size: int = 0) -> GroupFacts:
    """Derive a group's measured ``free_gib_before_load`` per GPU (pure): ``places`` are its
    (host, GPU index) in the profile's order (node-major, replica-major: every node of every
    server), ``gpus`` each host's nvidia-smi rows, ``server_size`` the GPUs of one server (0: all).

    A GPU index nvidia-smi does not list gives None and a note; a GPU with processes holding
    memory gives its current free memory and a note (if that process is this group's server,
    the value is not the free memory before weight load). With ``tp`` (the group's tp-size) > 1,
    free memories SGLang would refuse as unbalanced (:func:`dsv4ctl.plan.verdict.unbalanced`)
    give a note too."""
    by_index = {(h, g.index): g for h, rows in gpus.items() for g in rows}
    multi = len({h for h, _ in places}) > 1
    rows, frees, notes = [], [], []
    for host, i in places:
        g = by_index.get((host, i))
        rows.append(g)
        name = f"GPU {i} of {host}" if multi else f"GPU {i}"
        if g is None or g.free_mib is None:
            frees.append(None)
            notes.append(f"{name}: not reported by nvidia-smi on {host}" if g is None else
                         f"{name}: free memory unknown (nvidia-smi on {host} gives no number, e.g. [N/A]): "
                         "free_gib_before_load not measured")
            continue
        frees.append(round(g.free_mib / 1024 - CONTEXT_GIB, 3))
        if g.processes:
            held = ", ".join(f"{p.name or '?'} (pid {p.pid}, {p.used_mib if p.used_mib is not None else '?'} MiB)"
                             for p in g.processes)
            notes.append(f"{name}: memory held by {held}: stop them (or the server) to measure free memory "
                         "before weight load")
    # SGLang's imbalance check spans every rank of one server, all its nodes (model_runner.py):
    # with replicas (``server_size`` GPUs each) every replica on its own
    size = server_size or len(frees) or 1
    for k in range(0, len(frees), size):
        why = unbalanced([f for f in frees[k:k + size] if f is not None]) if tp > 1 else None
        if why:
            rep = f" (replica {k // size})" if size < len(frees) else ""
            notes.append(f"unbalanced{rep}: {why}")
    return GroupFacts(group=group, host=places[0][0] if places else "", gpus=rows, free_gib_before_load=frees,
                      notes=notes, places=list(places))


def memory_yaml(facts: list[GroupFacts]) -> str:
    """The profile lines to paste under each group (``memory:``), one group after another."""
    out = []
    for f in facts:
        vals = ", ".join("null" if v is None else f"{v}" for v in f.free_gib_before_load)
        where = ", ".join(dict.fromkeys(h for h, _ in f.places)) or f.host
        out.append(f"# group {f.group} ({where}): groups[].memory\n    free_gib_before_load: [{vals}]")
    return "\n".join(out)


FREE_KEY = ("memory", "free_gib_before_load")
"""Where a group's measured P goes in the profile: ``groups[<i>].memory.free_gib_before_load``."""


def values_to_write(f: GroupFacts, gpus: list[int], old, force: bool = False) -> tuple[Optional[list[float]], list[str]]:
    """The per-GPU ``free_gib_before_load`` list to write for a group (GiB, ``gpus`` order) and the
    reasons it must not be written (pure).

    A GPU with processes holding memory (its free memory is not the free memory before load) or
    one nvidia-smi did not report is a reason, one line each naming group and GPU. With ``force``
    the first is written as measured and the second keeps the profile's value for that GPU
    (``old``: the current value, a number or a per-GPU list, or None); a GPU with neither stays a
    reason. Values is None when there is a reason."""
    problems, out = [], []
    for i, (idx, gpu, v) in enumerate(zip(gpus, f.gpus, f.free_gib_before_load)):
        on = f.places[i][0] if i < len(f.places) else f.host
        if v is None:
            kept = old[i] if isinstance(old, list) and i < len(old) else old if isinstance(old, (int, float)) else None
            if force and kept is not None:
                out.append(kept)
                continue
            what = "not reported by nvidia-smi" if gpu is None else "free memory unknown to nvidia-smi ([N/A])"
            problems.append(f"group {f.group}: GPU {idx} on {on} {what}"
                            + (" and the profile has no value to keep" if force else ""))
            continue
        if gpu is not None and gpu.processes and not force:
            held = ", ".join(f"{p.name or '?'} pid {p.pid}" for p in gpu.processes)
            problems.append(f"group {f.group}: GPU {idx} on {on} has processes holding memory ({held}): "
                            "its free memory is not the free memory before load")
            continue
        out.append(v)
    return (None if problems else out), problems


def profile_with_facts(text: str, label: str, values: dict[int, list[float]], stamp: str) -> str:
    """The profile ``text`` with ``groups[i].memory.free_gib_before_load`` set to ``values[i]``
    for each group index ``i`` (round-trip: :func:`dsv4ctl.profile.edit.set_value`, every other
    byte kept), each line commented ``# measured by dsv4ctl facts <stamp>``. Raises InputError
    when the profile cannot be edited that way."""
    from ..profile.edit import set_value
    for i, vals in values.items():
        text = set_value(text, ("groups", i) + FREE_KEY, vals, label, f"# measured by dsv4ctl facts {stamp}")
    return text
