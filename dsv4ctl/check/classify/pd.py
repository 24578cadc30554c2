"""The one table of SGLang's PD abort messages: which class a failed disaggregated request is.

A PD request that SGLang aborts reaches the client as HTTP 500 (or an SSE error) whose message is
the one the scheduler logs (``logger.error`` on decode, ``logger.warning`` on prefill), so the same
table judges what ``check load`` received and the lines ``diagnose`` reads in the servers' logs::

    Decode transfer failed for request rank=0 decode_req.req.rid='…' decode_req.req.bootstrap_room=7
        with exception KVTransferError(bootstrap_room=7): Aborted by AbortReq.

The message has a stage (``Decode|Prefill transfer|handshake|bootstrap failed for request``,
``srt/disaggregation/decode.py`` and ``prefill.py``) and, after ``with exception``, the reason the
KV manager recorded (``srt/disaggregation/common/conn.py``, ``mooncake/conn.py``,
``nixl/conn.py``). The reason decides when it says more than the stage: a request aborted
elsewhere (``AbortReq``: the client, the router or the peer cancelled it) is no transfer failure
even though decode reports it as one. Texts read in the wheels of SGLang 0.5.18, 0.5.20, 0.5.22
and 0.5.23 (``pip download --no-deps sglang==V``): they are the same in every release that serves
DeepSeek-V4; the ``Failed to get kvcache`` reason is ``mooncake/conn.py``'s in 0.5.18 and
``common/conn.py``'s ``DEFAULT_PREFILL_FAILURE_REASON`` from 0.5.20 on."""

from __future__ import annotations

import re
from typing import NamedTuple, Optional

from .classes import HTTP_ERROR, PD_ABORTED, PD_BOOTSTRAP, PD_TRANSFER, STUCK, TurnResult, Verdict


class PdPattern(NamedTuple):
    """One row of :data:`PD_ABORTS`: the class, the pattern (searched in one message or log
    line), and where SGLang writes that text."""

    cls: str
    pattern: re.Pattern
    source: str


#: a PD abort message's stage: every PD abort a client or a log sees starts with one of these
STAGE = re.compile(r"\b(Decode|Prefill) (transfer|handshake|bootstrap) failed for request")

PD_ABORTS: tuple[PdPattern, ...] = (
    # reasons first (the text after "with exception KVTransferError(...): ")
    PdPattern(PD_ABORTED, re.compile(r"Aborted by AbortReq|Aborted by decode-side abort notification"
                                     r"|Received abort notification for room"),
              "common/conn.py record_failure(room, 'Aborted by AbortReq.') (0.5.18-0.5.23); nixl/conn.py"),
    PdPattern(PD_BOOTSTRAP, re.compile(r"in KVPoll\.Bootstrapping|Could not fetch (?:bootstrap|prefill parallel) info"
                                       r"|Lost connection with prefill instance|Duplicate (?:or cancelled |decode )?"
                                       r"bootstrap room|follow_bootstrap_room conflict"),
              "common/conn.py: SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, bootstrap-info fetch, lost prefill (0.5.18-0.5.23)"),
    PdPattern(PD_TRANSFER, re.compile(r"in KVPoll\.WaitingForInput|Failed to get kvcache from prefill instance"
                                      r"|Timed out waiting for prefill completion|KV checksum mismatch"
                                      r"|is healthy before, but now it is down"),
              "common/conn.py: SGLANG_DISAGGREGATION_WAITING_TIMEOUT, prefill failed or down; decode.py checksum"),
    # then the stage alone
    PdPattern(PD_BOOTSTRAP, re.compile(r"\b(?:Decode|Prefill) (?:handshake|bootstrap) failed for request"),
              "decode.py 'Decode handshake failed …', prefill.py 'Prefill bootstrap failed …' (0.5.18-0.5.23)"),
    PdPattern(PD_TRANSFER, re.compile(r"\b(?:Decode|Prefill) transfer failed for request"),
              "decode.py 'Decode transfer failed …', prefill.py 'Prefill transfer failed …' (0.5.18-0.5.23)"),
)
"""First match wins; only text that carries a :data:`STAGE` is judged (a reason alone can be
any log line about a room)."""


def pd_abort_class(text: str) -> Optional[str]:
    """The PD abort class (``pd_aborted``, ``pd_bootstrap_failed``, ``pd_transfer_failed``) of an
    error message or a log line, None when it is no PD abort (no :data:`STAGE` in it)."""
    if not STAGE.search(text):
        return None
    return next((p.cls for p in PD_ABORTS if p.pattern.search(text)), None)


_REASON = re.compile(r"with exception (?:\w+\([^)]{0,80}\): )?(.{1,400})")


def clip_abort(text: str, n: int) -> str:
    """``text`` cut to about ``n`` characters (:func:`dsv4ctl.render.clip`) so that a PD abort
    keeps its class: when the cut would lose the reason that decides it (``… with exception
    KVTransferError(…): Aborted by AbortReq.`` at the end of a 250-character message), the stage
    is cut shorter and the reason (at most ``n // 2`` characters) follows it after `` … ``."""
    from ...render import clip
    short = clip(text, n)
    cls = pd_abort_class(text)
    m = _REASON.search(text)
    if cls is None or pd_abort_class(short) == cls or m is None:
        return short
    reason = clip(m[1].rstrip('"} '), n // 2)
    head = clip(text[:m.start()].rstrip(), max(n - len(reason) - 3, STAGE.search(text).end()))
    return head + (" " if head.endswith("…") else " … ") + reason


def no_answer(turn: TurnResult) -> Optional[Verdict]:
    """The Verdict of a turn that got no answer to judge (a stall, an HTTP or protocol error; the
    PD aborts of :data:`PD_ABORTS` get their own classes), else None."""
    if turn.stalled:
        return Verdict(STUCK, (STUCK,), turn.error or "no progress within the stall timeout")
    if turn.error or turn.http_status != 200:
        why = turn.error or f"HTTP {turn.http_status}"
        cls = pd_abort_class(why) or HTTP_ERROR
        return Verdict(cls, (cls,), why)
    return None
