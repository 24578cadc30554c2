"""Async load driver for ``dsv4ctl check load`` (aiohttp; imported only by the command).

One asyncio task per concurrent session; each sends its turns back to back (no think time), reads
the answer (SSE or JSON), classifies it with :mod:`.classify` and hands a per-turn record to a
callback. "No progress within the stall timeout" is the session's ``sock_read`` timeout, kept per
turn by :class:`_Stall`: no byte of the response (headers or body) for ``stall_timeout`` seconds →
the turn is ``stuck``; so is a turn
whose complete answer has not arrived within ``turn_timeout`` seconds (a server dripping bytes).
Bodies are read with the size limits of :mod:`.classify` (``MAX_JSON_BODY``, ``MAX_SSE_LINE``,
``MAX_CONTENT``, ``MAX_PIECES``); a response over a limit is a protocol error, never a MemoryError.

Crash detection (docs/check.md, "Crashes"): a turn whose transport failed before or while the
answer arrived (:data:`CONNECTION_ERRORS`: refused, reset, server disconnected, body cut short) is a
*connection error*. Once ``crash_after`` (default ``max(8, concurrency)``) consecutive turns end in
one, with no turn answered in between, the level stops early and :attr:`LevelRun.crash` says so;
a level that ends with fewer such trailing turns is a crash too if ``GET /health`` then cannot
connect either.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import aiohttp

from ..render import clip
from . import classify as C
from . import expect as E
from .classify.pd import clip_abort
from .workload import TOOLS, Session, body_bytes

DEFAULT_TURN_TIMEOUT = 600.0     # seconds for one complete answer (``--turn-timeout``)
ERROR_TEXT = 200
"""Characters of a server's error body or an error's words kept in a turn's ``error`` (and so in
its reason): cut at a word boundary with "…" (:func:`dsv4ctl.render.clip`)."""

JSON_HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream, application/json"}


CONNECTION_ERRORS = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)
"""Transport failures that make a turn a *connection error* (crash evidence): ClientConnectorError
(refused, unreachable), ClientOSError / ClientConnectionResetError (reset), ServerDisconnectedError,
ClientPayloadError (the body was cut short: the server went away mid-answer). Timeouts (also
connect timeouts) are not: they are ``stuck`` turns, caught before these."""


LOCAL_ERRNOS = ("EMFILE", "ENFILE", "EADDRNOTAVAIL", "ENOBUFS", "ENOMEM")
"""errno names of a connection that failed for a reason of this machine (out of file descriptors,
local ports, buffers or memory): they say nothing about the server."""


def _os_error(e: BaseException) -> Optional[OSError]:
    err = getattr(e, "os_error", None)
    if isinstance(err, OSError):
        return err
    return e if isinstance(e, OSError) else None


def _local_limit(e: BaseException) -> bool:
    """True when a connection failed for a reason of this machine (:data:`LOCAL_ERRNOS`), which
    says nothing about the server."""
    import errno
    err = _os_error(e)
    return err is not None and err.errno in {getattr(errno, n) for n in LOCAL_ERRNOS if hasattr(errno, n)}


def _dns_failure(e: BaseException) -> bool:
    """True for a name that could not be resolved (aiohttp ``ClientConnectorDNSError``, a
    ``socket.gaierror`` underneath)."""
    import socket
    return isinstance(e, getattr(aiohttp, "ClientConnectorDNSError", ())) or isinstance(_os_error(e), socket.gaierror)


def _host_port(url) -> str:
    """``host:port`` of ``url`` (``[v6]:port`` for an IPv6 literal), or the URL when it has none."""
    from yarl import URL
    try:
        u = URL(str(url))
        host, port = u.raw_host, u.port
    except (ValueError, TypeError):
        return str(url)
    if not host:
        return str(url)
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{port}" if port else host


def _first_line(text: str, n: int = 100) -> str:
    from ..render import printable
    t = str(text).strip().splitlines()[0] if str(text).strip() else ""
    t = t.split(": b'", 1)[0].split(': b"', 1)[0].rstrip(":. ")
    return printable(clip(t, n))


def describe_client_error(e: BaseException, url, method: str = "GET") -> tuple[str, str]:
    """(kind, one-line message) for an aiohttp error of a request to ``url``, in the operator's
    words (no library class names). ``kind``: ``local`` (this machine: out of descriptors or
    ports; a name that does not resolve), ``connect`` (no HTTP answer: refused, reset, closed,
    unreachable) or ``protocol`` (the server answered with broken HTTP)."""
    import errno
    import os

    hp = _host_port(url)
    what = f"{method} {_path(url)}"
    err = _os_error(e)
    code = err.errno if err is not None and isinstance(err.errno, int) and err.errno > 0 else None
    strerror = ((os.strerror(code) if code in errno.errorcode else None)
                or (err.strerror if err is not None else None) or "").strip().lower()
    if _dns_failure(e):
        host = getattr(e, "host", None) or hp.rsplit(":", 1)[0]
        return "local", f"cannot resolve {host} ({strerror or 'name resolution failed'})"
    if _local_limit(e):
        name = errno.errorcode.get(err.errno, "")
        why = {"EMFILE": "out of file descriptors (raise the limit with ulimit -n or use fewer sessions)",
               "ENFILE": "the system is out of file descriptors",
               "EADDRNOTAVAIL": "out of local ports (use fewer sessions)"}.get(name, strerror or name)
        return "local", f"cannot connect to {hp}: this machine is {why}" if name in (
            "EMFILE", "ENFILE", "EADDRNOTAVAIL") else f"cannot connect to {hp}: this machine: {why}"
    facts = {"hp": hp, "what": what, "why": strerror or _first_line(e), "first": _first_line(e),
             "message": _first_line(getattr(e, "message", "")), "url": _first_line(url)}
    for cls, errno_name, kind, text in CLIENT_ERROR_TEXTS:
        if isinstance(e, cls) and (errno_name is None or (err is not None and err.errno == getattr(errno, errno_name))):
            return kind, text.format(**facts)
    return "connect", f"{hp}: {what}: {_first_line(e) or type(e).__name__}"


CLIENT_ERROR_TEXTS: tuple[tuple[type, Optional[str], str, str], ...] = (
    (aiohttp.ClientConnectorError, None, "connect", "cannot connect to {hp} ({why})"),
    (aiohttp.ServerDisconnectedError, None, "connect", "{hp} closed the connection without an HTTP answer ({what})"),
    (aiohttp.TooManyRedirects, None, "protocol", "{hp}: {what}: too many redirects (a redirect loop)"),
    (aiohttp.RedirectClientError, None, "protocol", "{hp}: {what}: a redirect to a URL that is not http(s)"),
    (aiohttp.ClientOSError, "ECONNRESET", "connect", "{hp} reset the connection ({what})"),
    (aiohttp.ClientOSError, None, "connect", "{hp}: {what}: {why}"),
    (aiohttp.ClientPayloadError, None, "protocol", "{hp}: {what}: broken HTTP body ({first})"),
    (aiohttp.ClientResponseError, None, "protocol", "{hp}: {what}: broken HTTP answer ({message})"),
    (aiohttp.InvalidURL, None, "connect", "{url}: not a usable URL"),
)
"""How :func:`describe_client_error` words an aiohttp error that is not this machine's: (class,
errno name or None, kind, text), first match wins (subclasses before their bases). The text's
fields: ``hp`` (host:port), ``what`` (``METHOD /path``), ``why`` (the OS's words, else the
error's first line), ``first`` (the error's first line), ``message`` (its ``message``), ``url``."""


def ensure_fd_limit(concurrency: int, spare: int = 64) -> int:
    """Make room for ``concurrency`` connections plus ``spare`` descriptors on top of the ones
    already open: raise the soft RLIMIT_NOFILE up to the hard limit when needed. Returns the soft
    limit; ValueError (one line) when even the hard limit is too small."""
    import os
    import resource
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = 0
    need = in_use + concurrency + spare
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return soft
    if hard == resource.RLIM_INFINITY or hard >= need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        return need
    raise ValueError(f"{concurrency} sessions need about {need} open files ({in_use} in use), but the limit is "
                     f"{hard} (raise it with ulimit -n)")


def crash_threshold(concurrency: int) -> int:
    """K: consecutive connection-error turns that end a level as crashed, ``max(8, concurrency)``."""
    return max(8, concurrency)


class ConnectError(Exception):
    """The target cannot be reached at all (connection refused, DNS, TLS)."""


class ClientSideError(ConnectError):
    """A failure of this machine, not of the server (out of file descriptors or local ports, a
    name that does not resolve): the run stops (exit 2) and nothing is counted as corruption."""


AUTH_STATUSES = (401, 403)
"""HTTP statuses of a refused API key (SGLang 0.5.23 ``srt/utils/auth.py``: 401 for a missing or
wrong bearer token, 403 for an admin-only endpoint)."""


class AuthRefused(ClientSideError):
    """The server refuses the client's API key (HTTP 401 / 403) before it accepted any request of
    the run: the client's configuration is wrong (no key, or another key than the server's), so
    the run stops (exit 2) and nothing is judged. ``status``: the HTTP status."""

    def __init__(self, status: int, url, method: str, key_sent: bool):
        self.status = status
        what = "refuses the API key" if key_sent else "needs an API key"
        super().__init__(f"{_host_port(url)} {what} (HTTP {status} for {method} {_path(url)}): "
                         f"set DSV4CTL_API_KEY or the serve config's api-key")


def key_sent(http: aiohttp.ClientSession) -> bool:
    """True when ``http`` sends an ``Authorization`` header (:func:`auth_headers`)."""
    return "Authorization" in http.headers


class BadResponse(Exception):
    """The target answered, but with a body over :data:`classify.MAX_JSON_BODY` bytes."""


async def read_capped(resp: aiohttp.ClientResponse, limit: int, stall: Optional["_Stall"] = None) -> bytes:
    """The whole body of ``resp``, or C.ProtocolError as soon as it exceeds ``limit`` bytes
    (nothing past the limit is kept in memory); each read is progress for ``stall``."""
    parts, n = [], 0
    async for data in resp.content.iter_any():
        if stall is not None:
            stall.last = stall.loop.time()
        n += len(data)
        if n > limit:
            raise C.ProtocolError(f"response body larger than {limit} bytes")
        parts.append(data)
    return b"".join(parts)


class _Stall:
    """A turn's stall timeout: no byte of the answer (headers or body) for ``after`` seconds ends
    the turn, through its ``asyncio.timeout`` ``deadline``. aiohttp's ``sock_read`` does the same by cancelling and re-creating a timer
    on every read (~40 per streamed answer, a tenth of ``check load``'s client CPU per request,
    benchmarks/check_load.py); here a read only records the time (:attr:`last`), and one timer,
    armed for ``last + after``, arms itself again when there was progress meanwhile."""

    __slots__ = ("loop", "deadline", "after", "last", "handle")

    def __init__(self, deadline: asyncio.Timeout, after: float):
        self.loop = asyncio.get_running_loop()
        self.deadline, self.after = deadline, after
        self.last = self.loop.time()
        self.handle = self.loop.call_at(self.last + after, self._check)

    def _check(self) -> None:
        now = self.loop.time()
        if self.deadline.expired():          # the turn timeout is ending it already
            return
        if now - self.last >= self.after:
            self.deadline.reschedule(now)
        else:
            self.handle = self.loop.call_at(self.last + self.after, self._check)

    def cancel(self) -> None:
        self.handle.cancel()


_NO_READ_TIMEOUT: dict[Optional[float], aiohttp.ClientTimeout] = {}


def _turn_timeout(http: aiohttp.ClientSession) -> aiohttp.ClientTimeout:
    """The session's timeouts without ``sock_read`` (a turn's :class:`_Stall` keeps it)."""
    t = http.timeout
    key = (t.total, t.connect, t.sock_connect, t.ceil_threshold)
    got = _NO_READ_TIMEOUT.get(key)
    if got is None:
        got = _NO_READ_TIMEOUT[key] = aiohttp.ClientTimeout(total=t.total, connect=t.connect, sock_connect=t.sock_connect,
                                                            sock_read=None, ceil_threshold=t.ceil_threshold)
    return got


@dataclass
class LevelRun:
    """Records and timing of one concurrency level against one URL."""

    url: str
    concurrency: int
    target: int
    records: list[dict] = field(default_factory=list)
    itl_gaps: list[float] = field(default_factory=list)
    started: float = 0.0
    duration_s: float = 0.0
    client_cpu_s: float = 0.0
    """CPU seconds this client process spent while the level ran (``time.process_time``)."""
    metrics_before: Optional[dict] = None
    metrics_after: Optional[dict] = None
    key_accepted: bool = False
    """True once a turn got an HTTP answer other than 401 / 403 (the server took the API key);
    passed on to the next level of the same URL (:func:`run_level` ``key_accepted``)."""
    capped: bool = False
    """True when ``max_duration`` ended the level before its target turns were issued."""
    crash: Optional[dict] = None
    """None, or the crash: {reason (str), started_at (Unix s, ``t_start`` of the first turn of the
    run of connection errors), turn (1-based position of that turn in ``records``), rid (its request
    id), streak (consecutive connection-error turns seen when the crash was declared), probe (None,
    or what ``GET /health`` said when the level ended before K)}."""


def auth_headers(api_key: Optional[str]) -> dict:
    """``Authorization: Bearer <key>`` for servers started with ``--api-key`` (SGLang
    ``srt/utils/auth.py``; /health and /metrics stay open); {} without a key."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def make_client(concurrency: int, stall_timeout: float, api_key: Optional[str] = None) -> aiohttp.ClientSession:
    """A client session sized for ``concurrency`` keep-alive connections; ``stall_timeout`` is the
    per-read timeout (seconds); ``api_key`` is sent as a bearer token."""
    conn = aiohttp.TCPConnector(limit=max(concurrency, 1) + 8, limit_per_host=0, ttl_dns_cache=300)
    return aiohttp.ClientSession(connector=conn, headers=auth_headers(api_key), timeout=aiohttp.ClientTimeout(
        total=None, sock_connect=min(10.0, stall_timeout), sock_read=stall_timeout))


async def fetch_json(http: aiohttp.ClientSession, url: str, timeout: float = 10.0) -> tuple[int, Any]:
    """GET ``url``: (status, parsed JSON or text; bytes that are not UTF-8 are replaced).
    Raises ConnectError when unreachable or no complete answer within ``timeout`` seconds,
    BadResponse for a body over ``C.MAX_JSON_BODY`` bytes."""
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            try:
                text = (await read_capped(r, C.MAX_JSON_BODY)).decode("utf-8", "replace")
            except C.ProtocolError as e:
                raise BadResponse(f"{url}: {e}") from None
            try:
                return r.status, json.loads(text)
            except (ValueError, RecursionError):
                return r.status, text
    except aiohttp.ClientError as e:
        kind, msg = describe_client_error(e, url)
        raise (ClientSideError if kind == "local" else ConnectError)(msg) from e
    except asyncio.TimeoutError as e:
        raise ConnectError(f"{_host_port(url)}: GET {_path(url)}: no answer within {timeout:g} s") from e


def _path(url) -> str:
    from yarl import URL
    try:
        return URL(str(url)).raw_path_qs or "/"
    except (ValueError, TypeError):
        return str(url)


async def discover_output_path(http: aiohttp.ClientSession, base: str) -> Optional[str]:
    """The DeepSeek-V4 output path of the server at ``base``: the ``version`` of its
    ``/server_info`` (else ``/get_server_info``) looked up in :data:`dsv4ctl.plan.versions.VERSIONS`
    (``detector`` for 0.5.18-0.5.22, ``deepseek-recipe`` for 0.5.23); None when it does not say
    (a gateway, an unsupported release, an error: known answers are then compared exactly)."""
    from ..plan.versions import VERSIONS
    for path in ("/server_info", "/get_server_info"):
        try:
            status, doc = await fetch_json(http, base + path)
        except (ConnectError, BadResponse):
            return None
        if status == 200 and isinstance(doc, dict):
            rules = VERSIONS.get(doc.get("version")) if isinstance(doc.get("version"), str) else None
            return rules.output_path if rules else None
    return None


async def discover_model(http: aiohttp.ClientSession, base: str) -> str:
    """The first model id of ``GET base/v1/models``. ConnectError if unreachable or not a model
    list (an id that is not a non-empty string included); :class:`AuthRefused` for HTTP 401 / 403;
    BadResponse if over the size limit."""
    status, doc = await fetch_json(http, base + "/v1/models")
    if status in AUTH_STATUSES:
        raise AuthRefused(status, base + "/v1/models", "GET", key_sent(http))
    try:
        if status != 200:
            raise KeyError
        mid = doc["data"][0]["id"]
        if not isinstance(mid, str) or not mid:
            raise TypeError
        return mid
    except (KeyError, IndexError, TypeError):
        raise ConnectError(f"{base}/v1/models: HTTP {status}, no model listed") from None


async def scrape_metrics(http: aiohttp.ClientSession, base: str) -> Optional[dict[str, float]]:
    """``GET base/metrics`` summed per sample name over labels (the ``cached_tokens_total``
    ``cache_source="total"`` sample is left out of the sum). None if not served (no
    ``--enable-metrics``) or unreachable."""
    from prometheus_client.parser import text_string_to_metric_families
    try:
        async with http.get(base + "/metrics", timeout=aiohttp.ClientTimeout(total=10)) as r:
            if r.status != 200:
                return None
            text = (await read_capped(r, C.MAX_JSON_BODY)).decode("utf-8", "replace")
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, C.ProtocolError):
        return None
    out: dict[str, float] = {}
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.labels.get("cache_source") == "total":
                    continue
                out[s.name] = out.get(s.name, 0.0) + float(s.value)
    except (ValueError, IndexError, TypeError, KeyError):
        return None
    return out


async def run_turn(http: aiohttp.ClientSession, url: str, body: dict, stream: bool,
                   turn_timeout: float = DEFAULT_TURN_TIMEOUT) -> tuple[C.TurnResult, dict]:
    """Send one turn; return what arrived and timings {ttft_s, e2e_s, gaps, chunks}.

    The body's ``rid`` (SGLang's request id) is sent as an ``X-Request-Id`` header too: the PD
    gateways (sglang-router 0.3.2 drops ``rid``; smg 1.13.0 keeps it) log and echo that header,
    so one id names the turn in the client's records and the gateway's and server's logs.
    ``timing["echoed_request_id"]`` is the response's ``X-Request-Id`` (None without one).

    Never raises for the server's transport problems: they become ``error``/``stalled`` in the
    TurnResult; a failure of this machine (out of descriptors or ports, DNS) raises
    :class:`ClientSideError` (it is not the server's answer, so it is no turn);
    ``timing["connection_error"]`` is True when the turn failed with one of
    :data:`CONNECTION_ERRORS` (no HTTP answer, or the answer cut off), else False.
    ``turn_timeout``: seconds for the complete answer (past it the turn is ``stalled``, even if
    bytes keep trickling in); the session's ``sock_read`` timeout is the no-progress limit."""
    t0 = time.perf_counter()
    timing: dict[str, Any] = {"ttft_s": None, "e2e_s": None, "gaps": [], "chunks": 0, "connection_error": False,
                              "echoed_request_id": None}
    sock_read = http.timeout.sock_read
    rid = body.get("rid")
    headers = {**JSON_HEADERS, "X-Request-Id": rid} if isinstance(rid, str) and rid else JSON_HEADERS
    try:
        async with asyncio.timeout(turn_timeout) as deadline:
            stall = _Stall(deadline, sock_read) if sock_read else None
            try:
                return await _answer(http, url, body, headers, stream, t0, timing, stall)
            finally:
                if stall is not None:
                    stall.cancel()
    except asyncio.TimeoutError:
        timing["e2e_s"] = time.perf_counter() - t0
        why = (f"no complete answer within {turn_timeout:g} s" if timing["e2e_s"] >= turn_timeout * 0.999
               or sock_read is None else f"no progress for {sock_read:g} s")
        return C.TurnResult(http_status=None, stalled=True, error=why), timing
    except aiohttp.ClientError as e:
        if _local_limit(e) or _dns_failure(e):
            # this machine's failure, not the server's: never a turn, never corruption
            raise ClientSideError(describe_client_error(e, url, "POST")[1]) from e
        timing["e2e_s"] = time.perf_counter() - t0
        timing["connection_error"] = isinstance(e, CONNECTION_ERRORS)
        return C.TurnResult(http_status=None, error=f"{type(e).__name__}: {clip(e, ERROR_TEXT)}"), timing


async def _answer(http: aiohttp.ClientSession, url: str, body: dict, headers: dict, stream: bool, t0: float,
                  timing: dict, stall: Optional[_Stall]) -> tuple[C.TurnResult, dict]:
    """:func:`run_turn`'s request and the reading of its answer (``stall``: the turn's stall
    timeout, told of every read)."""
    async with http.post(url, data=body_bytes(body), headers=headers, timeout=_turn_timeout(http)) as resp:
        if stall is not None:
            stall.last = stall.loop.time()
        timing["echoed_request_id"] = resp.headers.get("X-Request-Id")
        if resp.status != 200:
            text = (await resp.content.read(4096)).decode("utf-8", "replace")
            timing["e2e_s"] = time.perf_counter() - t0
            return C.TurnResult(http_status=resp.status,
                                error=f"HTTP {resp.status}: {clip_abort(' '.join(text.split()), ERROR_TEXT)}"), timing
        if not stream:
            try:
                raw = await read_capped(resp, C.MAX_JSON_BODY, stall)
            except C.ProtocolError as e:
                timing["e2e_s"] = time.perf_counter() - t0
                return C.TurnResult(http_status=200, error=f"protocol: {e}"), timing
            timing["e2e_s"] = time.perf_counter() - t0     # no first token to time without SSE
            try:
                return C.parse_completion(json.loads(raw)), timing
            except (ValueError, RecursionError) as e:     # ProtocolError and JSON/UTF-8 errors are ValueErrors
                return C.TurnResult(http_status=200, error=f"protocol: {clip(e, ERROR_TEXT)}"), timing
        dec, asm = C.SSEDecoder(), C.StreamAssembler()
        last = None
        seen = 0
        clock = stall.loop.time if stall is not None else None
        try:
            async for data in resp.content.iter_any():
                if clock is not None:
                    stall.last = clock()
                asm.feed_payloads(dec.feed(data))
                if asm.pieces > seen:
                    now = time.perf_counter()
                    if timing["ttft_s"] is None:
                        timing["ttft_s"] = now - t0
                    elif last is not None:
                        timing["gaps"].append(now - last)
                    last = now
                    seen = asm.pieces
            asm.feed_payloads(dec.close())
            timing["chunks"] = asm.chunks
            timing["e2e_s"] = time.perf_counter() - t0
            return asm.result(), timing
        except (ValueError, RecursionError) as e:     # ProtocolError, UnicodeDecodeError
            timing["e2e_s"] = time.perf_counter() - t0
            return C.TurnResult(http_status=200, error=f"protocol: {clip(e, ERROR_TEXT)}"), timing


async def probe_health(http: aiohttp.ClientSession, base: str, timeout: float = 5.0,
                       silent_is_dead: bool = False) -> Optional[str]:
    """``GET base/health`` once: None if the server answered (any HTTP status), else why it could
    not connect (a :data:`CONNECTION_ERRORS` failure). A timeout counts as answered (something
    holds the port) unless ``silent_is_dead``: after a run of stalled turns, a server that does not
    answer ``/health`` within ``timeout`` seconds either has stopped answering."""
    try:
        async with http.get(base.rstrip("/") + "/health", timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            await r.content.read(1024)
            return None
    except asyncio.TimeoutError:
        return f"GET /health: no answer within {timeout:g} s" if silent_is_dead else None
    except CONNECTION_ERRORS as e:
        if _local_limit(e) or _dns_failure(e):
            raise ClientSideError(describe_client_error(e, base.rstrip("/") + "/health")[1]) from e
        return f"GET /health: {type(e).__name__}: {clip(e, ERROR_TEXT)}"
    except aiohttp.ClientError:
        return None


async def run_level(http: aiohttp.ClientSession, url: str, model: str, concurrency: int, turns: int,
                    target: int, stream: str = "mixed", answer_words: int = 150,
                    on_record: Optional[Callable[[dict], None]] = None, run_id: str = "",
                    label: str = "", stop: Optional[Callable[[], bool]] = None,
                    turn_timeout: float = DEFAULT_TURN_TIMEOUT, crash_after: Optional[int] = None,
                    thinking: bool = False, key_accepted: bool = False,
                    max_duration: Optional[float] = None, output_path: Optional[str] = None) -> LevelRun:
    """Run one concurrency level: ``concurrency`` workers, each running sessions of ``turns``
    turns back to back until ``target`` turns were issued in total. Returns a LevelRun whose
    ``records`` are the per-turn records (schema in docs/check.md). Request ids are
    ``dsv4ctl-<run_id><label>-c<concurrency>-s<session>-t<turn>-<n>`` (sent as SGLang's ``rid``).
    ``stop()`` returning True makes every worker stop before its next turn (interrupts).
    ``turn_timeout``: seconds for one complete answer (see :func:`run_turn`). ``thinking``: every
    request asks for thinking (``chat_template_kwargs.thinking``), and an answer without
    ``reasoning_content`` is then ``reasoning_in_content``. Every turn is judged by
    :func:`.expect.judge` (shape and leaks; known-answer turns against their expected calls).

    Crash: once ``crash_after`` (default :func:`crash_threshold`) consecutive turns, in the order
    they finished, end in a connection error (``connection_error`` in the record) with no answered
    turn in between, ``LevelRun.crash`` is set and every worker stops before its next turn (turns
    in flight finish and are recorded). If the level ends with 1..K−1 trailing connection-error
    turns (target reached, or fewer than K turns), one ``GET /health`` decides: cannot connect →
    crash. Not after ``stop()`` (an interrupt).

    A failure of this machine in any turn (:class:`ClientSideError`: out of file descriptors or
    local ports, DNS) stops every worker before its next turn and is raised once they are done;
    the turn it hit is not recorded (it says nothing about the server).

    API key: a turn answered HTTP 401 / 403 before any turn of the run got another HTTP answer
    (``key_accepted`` False: no earlier level of this URL did either) raises :class:`AuthRefused`
    the same way (the client's key is wrong or missing; nothing is judged). Once the server has
    taken the key, a later 401 / 403 is the server's answer (e.g. a worker behind a gateway with
    another key) and is recorded as an ``http_error`` turn.

    ``max_duration``: seconds after the level's start past which no new turn is issued (turns in
    flight finish and are recorded); ``LevelRun.capped`` says the target was not reached.
    ``output_path``: the server's DeepSeek-V4 output path (:func:`discover_output_path`), which
    :func:`.expect.judge` judges known answers by."""
    lv = _Level(http, url, model, concurrency, turns, target, stream, answer_words, on_record, run_id,
                label, stop, turn_timeout, crash_after, thinking, key_accepted, max_duration)
    lv.output_path = output_path
    return await lv.run()


class _Level:
    """The state of one :func:`run_level` (its arguments as attributes) while its workers run:
    turns issued, the next session id, the streak of consecutive connection-error (or stalled)
    turns that decides a crash, and a failure of this machine that stops every worker."""

    def __init__(self, http: aiohttp.ClientSession, url: str, model: str, concurrency: int, turns: int, target: int,
                 stream: str, answer_words: int, on_record: Optional[Callable[[dict], None]], run_id: str, label: str,
                 stop: Optional[Callable[[], bool]], turn_timeout: float, crash_after: Optional[int], thinking: bool,
                 key_accepted: bool, max_duration: Optional[float]):
        self.http, self.url, self.model, self.turns, self.target = http, url, model, turns, target
        self.stream, self.answer_words, self.on_record, self.label = stream, answer_words, on_record, label
        self.stop, self.turn_timeout, self.thinking = stop, turn_timeout, thinking
        self.endpoint = url.rstrip("/") + "/v1/chat/completions"
        self.deadline = time.monotonic() + max_duration if max_duration else None
        self.specs = C.tool_specs(TOOLS)
        self.output_path: Optional[str] = None     # the server's output path (run_level sets it)
        self.level = LevelRun(url=url, concurrency=concurrency, target=target, key_accepted=key_accepted)
        self.run_id = run_id or uuid.uuid4().hex[:8]
        self.issued = 0
        self.next_sid = concurrency
        self.k = crash_after if crash_after is not None else crash_threshold(concurrency)
        self.streak = 0             # consecutive connection-error turns, in finishing order
        self.streak_start = 0       # index in level.records of the first of them
        self.stalls = 0             # how many turns of the streak stalled (no answer within the stall timeout)
        self.probing = False        # a /health probe for a stalled streak is in flight
        self.failure: list[ClientSideError] = []   # this machine failed: every worker stops, the level raises

    async def run(self) -> LevelRun:
        """Run every worker; raise the first failure of this machine; a level that ends inside a
        streak is a crash when ``/health`` cannot be reached."""
        level = self.level
        level.started = time.time()
        t0, c0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(self.worker(w) for w in range(level.concurrency)))
        level.duration_s = time.perf_counter() - t0
        level.client_cpu_s = time.process_time() - c0
        if self.failure:
            raise self.failure[0]
        if level.crash is None and self.streak and not (self.stop and self.stop()):
            probe = await probe_health(self.http, self.url)
            if probe is not None:
                self.declare(f"fewer than K = {self.k} before the level ended, and {probe}", probe)
        return level

    def halted(self) -> bool:
        """No new turn: a crash, a failure of this machine, ``stop()``, or past ``max_duration``."""
        level = self.level
        if self.deadline is not None and time.monotonic() >= self.deadline and self.issued < self.target:
            level.capped = True
        return level.crash is not None or bool(self.failure) or bool(self.stop and self.stop()) or level.capped

    def declare(self, why: str, probe: Optional[str] = None) -> None:
        """Set the level's crash from the current streak."""
        first = self.level.records[self.streak_start]
        what = "a connection error" if not self.stalls else "a connection error or a stall"
        self.level.crash = {"reason": f"{self.streak} consecutive turns ended in {what} with no answer in "
                                      f"between ({why}); first: {first['reason']}",
                            "started_at": first["t_start"], "turn": self.streak_start + 1, "rid": first["rid"],
                            "streak": self.streak, "probe": probe}

    async def worker(self, w: int) -> None:
        """Sessions back to back (first id ``w``, then the next free one) until the target is
        issued or the level halts."""
        sid = w
        while self.issued < self.target and not self.halted():
            s = Session(sid=sid, turns=self.turns, answer_words=self.answer_words, thinking=self.thinking,
                        stream=self.stream == "on" or (self.stream == "mixed" and sid % 2 == 0))
            while not s.done and self.issued < self.target and not self.halted():
                if not await self.turn(s, sid):
                    return
            sid = self.next_sid
            self.next_sid += 1

    async def turn(self, s: Session, sid: int) -> bool:
        """Send, judge and record one turn of session ``s``; False when the worker must stop (a
        failure of this machine, or the API key refused)."""
        level = self.level
        self.issued += 1
        spec = s.spec()
        rid = f"dsv4ctl-{self.run_id}{self.label}-c{level.concurrency}-s{sid}-t{spec.index}-{self.issued}"
        t_start = time.time()
        try:
            result, timing = await run_turn(self.http, self.endpoint, s.request(self.model, rid), s.stream,
                                            self.turn_timeout)
        except ClientSideError as e:
            self.failure.append(e)
            return False
        if result.http_status in AUTH_STATUSES and not level.key_accepted:
            self.failure.append(AuthRefused(result.http_status, self.endpoint, "POST", key_sent(self.http)))
            return False
        if result.http_status is not None and result.http_status not in AUTH_STATUSES:
            level.key_accepted = True
        # the answer turn's instruction is English: an answer in another script is drift
        v = E.judge(result, requires_tool=spec.requires_tool, tools=self.specs, expected=spec.expected_calls,
                    tool_choice=spec.tool_choice, thinking_requested=self.thinking,
                    expected_script=None if spec.requires_tool else "Latin", output_path=self.output_path)
        rec = turn_record(self.run_id, self.url, level.concurrency, sid, spec, rid, s.stream, result, v, timing,
                          t_start)
        level.records.append(rec)
        if level.crash is None and not await self.track_crash(rec, result):
            return False
        level.itl_gaps.extend(timing["gaps"])
        if self.on_record:
            self.on_record(rec)
        s.advance(result, v.ok)
        return True

    async def track_crash(self, rec: dict, result: C.TurnResult) -> bool:
        """Extend or end the streak with the turn just recorded; declare a crash at K turns (with
        stalls in the streak only when ``/health`` does not answer either: a server with wedged
        transfers still answers it). False when that probe hit a failure of this machine."""
        if not (rec["connection_error"] or result.stalled):
            self.streak = 0
            return True
        if self.streak == 0:
            self.streak_start = len(self.level.records) - 1
            self.stalls = 0
        self.streak += 1
        self.stalls += bool(result.stalled)
        if self.streak >= self.k and not self.stalls:
            self.declare(f"K = {self.k}")
        elif self.streak >= self.k and not self.probing:
            self.probing = True
            try:
                probe = await probe_health(self.http, self.url, silent_is_dead=True,
                                           timeout=min(10.0, self.http.timeout.sock_read or 10.0))
            except ClientSideError as e:
                self.failure.append(e)
                return False
            finally:
                self.probing = False
            if probe is not None and self.level.crash is None:
                self.declare(f"K = {self.k}, {self.stalls} of them stalled, and {probe}", probe)
            elif probe is None:
                self.streak = 0
        return True


def turn_record(run_id: str, url: str, concurrency: int, sid: int, spec, rid: str, stream: bool,
                result: C.TurnResult, v: C.Verdict, timing: dict, t_start: float) -> dict:
    """The per-turn record of ``check load`` (schema in docs/check.md): who sent it, what was
    expected, the verdict, what arrived and its timings; ``content_excerpt`` for a turn not ok."""
    usage = result.usage or {}
    rec = {
        "run": run_id, "url": url, "concurrency": concurrency, "session": sid, "turn": spec.index,
        "rid": rid, "response_id": result.response_id, "stream": stream,
        "requires_tool": spec.requires_tool, "tool": spec.tool, "tool_choice": spec.tool_choice,
        "expected_calls": spec.expected_calls, "class": v.cls, "notes": list(v.notes),
        "flags": list(v.flags), "reason": v.reason, "http_status": result.http_status,
        "finish_reason": result.finish_reason,
        "tool_calls": [{"name": c.name, "arguments": c.arguments[:300]} for c in result.tool_calls],
        "t_start": round(t_start, 6),
        "ttft_s": None if timing["ttft_s"] is None else round(timing["ttft_s"], 6),
        "e2e_s": None if timing["e2e_s"] is None else round(timing["e2e_s"], 6),
        "chunks": timing["chunks"],
        "completion_tokens": usage.get("completion_tokens"),
        "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
        "connection_error": timing["connection_error"],
        "echoed_request_id": timing["echoed_request_id"],
    }
    if not v.ok and result.content:
        rec["content_excerpt"] = result.content[:300]
    return rec
