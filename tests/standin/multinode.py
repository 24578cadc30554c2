"""SGLang's multi-node behaviour for the **stand-ins** (a GPU server cannot run here).

What SGLang 0.5.23 does with ``--nnodes N --node-rank I --dist-init-addr HOST:PORT``, reduced to
what a deploy can see, and what these helpers reproduce over a plain TCP connection:

- node 0 opens the torch.distributed store on the dist-init address; the other nodes connect to
  it (retrying until node 0 is there, up to the dist-init timeout). Node 0 serves HTTP, and
  only once every node has joined (its HTTP server starts after ``init_process_group``: the model
  is sharded over all ranks), so until then its port refuses connections;
- nodes 1..N-1 serve no HTTP; they run until node 0 goes away, then exit (their collectives
  fail);
- a node that dies after joining leaves node 0 stuck in a collective: it stops answering
  (``on_lost``: the stand-in stalls, ``/health`` 503) until the NCCL watchdog fires, then exits.

Log lines are written to stdout as SGLang's would be (the deploy log of the node).

Knobs (environment of the stand-in): ``STANDIN_WATCHDOG_S`` (node 0's watchdog after a node is
lost, default 2 s), ``STANDIN_JOIN_TIMEOUT_S`` (how long a node retries the dist-init address,
default 120 s). Fault ``STANDIN_COLLECTIVE_HANG_S=T`` (issue 45, sglang#28915's DP-attention
all-reduce hang): T seconds after every node joined, an all-reduce never completes; every node
stays up, node 0 stops answering (its scheduler stalls: ``/health`` 503), node 1's NCCL watchdog
fires first and node 0's a second later, after SGLang's scheduler watchdog line; the lines are
PyTorch's and SGLang's own wording with the current time.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time


def add_args(ap) -> None:
    """SGLang's multi-node options on a stand-in's argparse parser."""
    ap.add_argument("--nnodes", type=int, default=1)
    ap.add_argument("--node-rank", type=int, default=0)
    ap.add_argument("--dist-init-addr", default=None)


def _split(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def log(msg: str) -> None:
    print(msg, flush=True)


def nccl_timeout_line(rank: int, seq: int = 48211) -> str:
    """PyTorch ProcessGroupNCCL's watchdog line for an ALLREDUCE that timed out, stamped now (glog)."""
    t = time.time()
    stamp = time.strftime("%m%d %H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e9):09d}"
    return (f"[rank{rank}]:[E{stamp} ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught collective operation "
            f"timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=7168, NumelOut=7168, Timeout(ms)=600000) "
            "ran for 600002 milliseconds before timing out.")


def _hang_after() -> float | None:
    v = os.environ.get("STANDIN_COLLECTIVE_HANG_S")
    return float(v) if v else None


async def _hang_node0(on_hang) -> None:
    """Node 0's side of ``STANDIN_COLLECTIVE_HANG_S``: stall, then the scheduler's and NCCL's watchdogs."""
    await asyncio.sleep(_hang_after() or 0.0)
    if on_hang is not None:
        on_hang()
    await asyncio.sleep(1.0)        # node 1's watchdog fires first (its rank waited longer)
    log(time.strftime("[%Y-%m-%d %H:%M:%S DP0 TP0] ", time.gmtime())
        + "Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)")
    await asyncio.sleep(0.5)
    log(nccl_timeout_line(0))


class Node0:
    """Node 0's side: the dist-init listener, who has joined, and the watchdog."""

    def __init__(self, nnodes: int, dist_init: str | None, on_lost=None):
        self.nnodes = nnodes
        self.dist_init = dist_init
        self.members: dict[int, asyncio.StreamWriter] = {}
        self.joined = nnodes <= 1
        self.lost: int | None = None
        self.on_lost = on_lost
        self.watchdog_s = float(os.environ.get("STANDIN_WATCHDOG_S", 2.0))
        self._all_in: asyncio.Event | None = None

    @property
    def ready(self) -> bool:
        """Every node joined and none lost: the server can answer."""
        return self.joined and self.lost is None

    async def join(self) -> None:
        """Open the dist-init listener and return once every node has joined (at once for one
        node). Call before the HTTP server starts."""
        if self.nnodes <= 1:
            return
        if not self.dist_init:
            raise SystemExit(f"ValueError: --dist-init-addr is required with --nnodes {self.nnodes}")
        self._all_in = asyncio.Event()
        host, port = _split(self.dist_init)
        await asyncio.start_server(self._member, host, port)
        log(f"[node 0] torch.distributed store listening on {host}:{port}, waiting for "
            f"{self.nnodes - 1} node(s)")
        await self._all_in.wait()

    async def _member(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        try:
            rank = int(line.decode().split()[1])
        except (IndexError, ValueError):
            writer.close()
            return
        self.members[rank] = writer
        log(f"[node 0] node {rank} joined ({len(self.members) + 1}/{self.nnodes})")
        if len(self.members) == self.nnodes - 1 and not self.joined:
            self.joined = True
            log(f"[node 0] all {self.nnodes} nodes joined: init_process_group done")
            self._all_in.set()
            if _hang_after() is not None:
                self._hang = asyncio.ensure_future(_hang_node0(self.on_lost))
        await reader.read()              # EOF: the node went away
        if self.lost is None:
            self.lost = rank
            log(f"[node 0] node {rank} lost: collectives stall until the watchdog "
                f"({self.watchdog_s:g} s)")
            if self.on_lost is not None:
                self.on_lost()
            await asyncio.sleep(self.watchdog_s)
            log(f"[Rank 0] Watchdog caught collective operation timeout: node {rank} is gone. "
                "Terminating the process.")
            sys.stdout.flush()
            os._exit(1)


async def _member(nnodes: int, rank: int, dist_init: str) -> int:
    host, port = _split(dist_init)
    deadline = time.monotonic() + float(os.environ.get("STANDIN_JOIN_TIMEOUT_S", 120))
    while True:
        try:
            reader, writer = await asyncio.open_connection(host, port)
            break
        except OSError:
            if time.monotonic() > deadline:
                log(f"[node {rank}] RuntimeError: timed out initializing the process group: "
                    f"dist-init address {dist_init} never answered")
                return 1
            await asyncio.sleep(0.2)
    writer.write(f"node {rank}\n".encode())
    await writer.drain()
    log(f"[node {rank}] joined node 0 at {dist_init} (nnodes {nnodes}); this node serves no HTTP")
    if _hang_after() is not None:
        async def hang() -> None:
            await asyncio.sleep(_hang_after() + 0.5)
            log(nccl_timeout_line(8 * rank))
        hung = asyncio.ensure_future(hang())          # noqa: F841 (kept alive until the node ends)
    await reader.read()                  # EOF: node 0 went away
    log(f"[node {rank}] RuntimeError: connection to node 0 ({dist_init}) closed: exiting")
    return 1


def run_member(nnodes: int, rank: int, dist_init: str | None) -> int:
    """A node of rank >= 1: join node 0, live until it goes away; the exit status."""
    if not dist_init:
        log(f"[node {rank}] ValueError: --dist-init-addr is required with --nnodes {nnodes}")
        return 2
    return asyncio.run(_member(nnodes, rank, dist_init))
