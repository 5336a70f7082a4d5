"""The HTTP side of `gpumon serve`: /metrics, /api/v1/state, /healthz and a landing page.

One asyncio event loop on its own thread serves every connection; requests are parsed by h11
(python-hyper's HTTP/1.1 state machine), never by hand. What a hostile client can do is bounded:

- A request's headers must arrive whole within `request_timeout_s` (a deadline for the whole
  head, not per byte), and be at most 16 KiB; so must a new connection's first request. A
  connection that has been served may then wait `keepalive_timeout_s` for its next one (a
  scraper's keep-alive), and has `request_timeout_s` again from that request's first byte.
- An idle connection costs a socket and a coroutine, not a thread: thousands can wait. At
  `max_connections`, one is closed to make room: the one that has waited longest without ever
  sending a whole request, and only when there is none, the served one idle longest. So a crowd
  of slow clients, even one that reconnects as soon as it is closed, never closes a scraper's
  kept-alive connection, and its scrapes never queue behind the crowd's connects. At the limit,
  connections are accepted no faster than EVICTIONS_PER_S: the rest wait in the kernel's backlog,
  not in the event loop.
- A TLS handshake has `request_timeout_s` to finish, and at most MAX_HANDSHAKES are under way at
  once: past that, the oldest is closed for the newcomer (at most EVICTIONS_PER_S a second, and
  only one under way for HANDSHAKE_FLOOR_S or more: a burst of young ones waits its turn). A
  connection in its handshake counts against `max_connections` and, at the limit, is closed to make
  room as one waiting for its request head is (whichever has waited longer). So a crowd that never
  finishes its handshakes holds a bounded memory (~70 KiB each) and never a real client's place.
- Requests carry no body: one that announces one (Content-Length, chunked) is answered 413 and its
  connection closed, so a body can never be read as a next request.
- bcrypt runs on one worker thread at nice 19 within a CPU budget, never on the event loop; each
  client address may have two checks pending (a retry of credentials turned away passes that, and
  comes first) and the queue is bounded, so a flood of wrong
  passwords cannot starve scrapers (whose credentials, once checked, are remembered by their
  SHA-256 and cost nothing) nor take more than a tenth of a core.

Each response is written in one piece with TCP_NODELAY, so a keep-alive client never waits on a
delayed ACK. Requests only read the latest snapshot (rendered once per snapshot), so scrapes
never call NVML. TLS and basic auth follow exporter-toolkit's web config file (gpumon.serve.webconfig).
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import base64
import binascii
import collections
import functools
import gzip
import logging
import os
import resource
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import h11

from gpumon.core.threads import named_thread
from gpumon.serve.cpu_budget import CpuBudget
from gpumon.serve.webconfig import WebConfig, WebConfigError

log = logging.getLogger("gpumon.serve.http")

MAX_HEADER_BYTES = 16 * 1024
LISTEN_BACKLOG = 1024
"""Connections the kernel queues before they are accepted."""
ACCEPT_BATCH = 16
"""Connections accepted in one pass of the event loop (asyncio's own server takes its listen
backlog's worth, 1,024, each with a task and a transport: under a crowd that reconnects as fast as
it is closed, one such pass held a kept-alive scraper's request back by hundreds of milliseconds)."""
EVICTIONS_PER_S = 200.0
"""At `max_connections`, connections are accepted (each closing another) at most this fast, with
as many at once: a crowd that reconnects as soon as it is closed then waits in the kernel's
backlog, at no cost to the daemon, instead of keeping its event loop busy a core's worth (the
connections already served are answered between its passes)."""
MAX_HANDSHAKES = 256
"""Connections in their TLS handshake at once (at most `max_connections`). Each costs ~70 KiB of
the daemon's memory (OpenSSL's and asyncio's buffers) until it finishes or its deadline
(`request_timeout_s`) passes, and that memory stays with the process: a crowd that opens
handshakes and never finishes them held every connection the limit allowed, and then more (the
connection limit could not close one still in its handshake), until the daemon ran out of file
descriptors and shut real clients out. A real client's handshake takes milliseconds: beyond this
many, the oldest is closed for the newcomer, at most EVICTIONS_PER_S a second."""
HANDSHAKE_FLOOR_S = 1.0
"""A handshake under way for less than this (or, where max_handshakes is under 200, for less than
max_handshakes / EVICTIONS_PER_S) is never closed for a newcomer past the bound:
the newcomers wait in the kernel's backlog instead. A real client's handshake takes milliseconds
(a slow network's, a round trip or two); closing the oldest whatever its age closed 144 of 400 real
clients that connected at once and sent their hellos half a second later."""
GZIP_MIN_BYTES = 1024
BCRYPT_THREADS = 1
"""One: a flood of wrong passwords then takes at most one core, at nice 19 (two took 1.5 cores of a
GPU node at the default priority, from the training job's loaders)."""
BCRYPT_CPU_SHARE = 0.1
"""bcrypt's CPU, averaged, in a bucket of BCRYPT_BURST_CPU_S (gpumon.serve.cpu_budget): a check
waits while the bucket is empty. ~2 checks a second at cost 10: a real client checks once (its
credentials are remembered), so only a flood ever waits."""
BCRYPT_BURST_CPU_S = 1.0
BCRYPT_PENDING_PER_CLIENT = 2
BCRYPT_QUEUE = 32
BAD_CREDENTIALS_REMEMBERED = 4096


@dataclass
class Response:
    """An answer: its status, body, content type and extra headers."""

    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()
    encoding: str | None = None
    """Set when `body` is already encoded (gzip) by the route."""


@dataclass(eq=False)  # state, not a value: equal only to itself
class Routes:
    """What the server answers with: one callable per endpoint, given by the daemon."""

    metrics: Callable[[str, bool], tuple[bytes, str, str | None]]
    """(Accept header, gzip accepted) -> (body, content type, content encoding or None)."""
    state: Callable[[], dict[str, Any]]
    health: Callable[[], tuple[bool, str]]
    landing: Callable[[], str]
    pcp: Callable[[], bytes] | None = None
    """/metrics/pcp: a few series in PCP's openmetrics dialect (gpumon.serve.pcp), for pcp-dstat."""
    analysis: Callable[[str, str], Awaitable[tuple[int, bytes, tuple[tuple[str, str], ...]]]] | None = None
    """/api/v1/analysis?QUERY, asked by a client address: (status, JSON body, headers such as
    Retry-After); awaited on the event loop (it must not block: gpumon.serve.analysis_api runs its
    work elsewhere)."""


def _text(status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(status, (message + "\n").encode(), headers=headers)


def accepts_gzip(header: str) -> bool:
    """Accept-Encoding names gzip (or *) with a q-value above 0."""
    for item in header.split(","):
        name, *params = item.split(";")
        if name.strip().lower() in ("gzip", "*"):
            for param in params:  # q among any others (`gzip;level=1;q=0`)
                key, _, value = param.strip().partition("=")
                if key.strip().lower() == "q":
                    try:
                        return float(value.strip()) > 0
                    except ValueError:
                        return False
            return True
    return False


@dataclass(eq=False)
class _Check:
    """A bcrypt check waiting for a thread."""

    client: str
    key: bytes
    creds: tuple[str, bytes]
    future: asyncio.Future[bool | None]
    seq: int
    prior: int
    """The client's arrival before this one (-1: its first)."""


class Authenticator:
    """Basic auth against bcrypt hashes, as exporter-toolkit checks it.

    - An unknown user costs a bcrypt check too (against a hash of the same cost), so the time of
      an answer does not tell which users exist.
    - Checked credentials are remembered by SHA-256: good ones (a scraper sends the same every few
      seconds; kept across a reload while the user's hash is unchanged) and a bounded number of bad
      ones (a flood repeating itself).
    - bcrypt runs on BCRYPT_THREADS threads at nice 19, never on the event loop, and only while
      its CPU budget (BCRYPT_CPU_SHARE) holds some: checks wait for the refill. Checks wait in a queue of
      BCRYPT_QUEUE, at most BCRYPT_PENDING_PER_CLIENT per client address, and are served fairly:
      first credentials already turned away once (a scraper retrying), then the client heard from
      longest ago (one never heard from first; the newest such first), so a client that asks every
      few seconds yields to one that asks every fifteen. A full queue makes room by turning away
      (429) the check that would be served last, when the newcomer comes before it. So addresses
      flooding wrong passwords share the threads among themselves, and a scraper from any other
      address is checked next (or, against endless new addresses, on its retry): a flood cannot
      shut a real client out. The same credentials arriving while their check runs share its answer.
    """

    def __init__(
        self,
        users: Mapping[str, bytes],
        previous: Authenticator | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._users = dict(users)
        self._monotonic = monotonic
        self.budget: CpuBudget = (
            previous.budget  # a reload must not hand a flood a full bucket
            if previous is not None
            else CpuBudget(BCRYPT_CPU_SHARE, BCRYPT_BURST_CPU_S, now=monotonic())
        )
        self._refill: asyncio.TimerHandle | None = None
        """A dispatch waiting for the bucket to refill."""
        self._good: dict[bytes, str] = {}
        """SHA-256 of good credentials -> their user."""
        if previous is not None:  # a reload: credentials checked against the same hash stay good
            self._good = {
                k: u for k, u in previous._good.items() if previous._users.get(u) == self._users.get(u)
            }
        self._bad: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._pool: ThreadPoolExecutor | None = None
        self._pending: collections.Counter[str] = collections.Counter()
        self._waiting: list[_Check] = []
        self._running = 0
        self._inflight: dict[bytes, asyncio.Future[bool | None]] = {}
        self._seen: collections.OrderedDict[str, int] = collections.OrderedDict()
        """client -> the sequence number of its last arrival (the oldest forgotten first)."""
        self._turned_away: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._seq = 0
        self._dummy: bytes | None = None

    @property
    def enabled(self) -> bool:
        return bool(self._users)

    def _decode(self, header: str | None) -> tuple[str, bytes] | None:
        if not header:
            return None
        scheme, _, value = header.strip().partition(" ")
        if scheme.lower() != "basic":  # RFC 7617: the scheme name is case-insensitive
            return None
        try:
            raw = base64.b64decode(value.strip(), validate=True)
        except (binascii.Error, ValueError):
            return None
        user, sep, password = raw.partition(b":")
        if not sep:
            return None
        try:
            return user.decode("utf-8"), password
        except UnicodeDecodeError:
            return None

    def _key(self, user: str, password: bytes) -> bytes:
        import hashlib  # only where users are configured: not on the first sample's path

        return hashlib.sha256(user.encode() + b"\0" + password).digest()

    def known(self, header: str | None) -> bool | None:
        """True/False when the answer is known without bcrypt; None when bcrypt must decide."""
        if not self._users:
            return True
        creds = self._decode(header)
        if creds is None:
            return False
        key = self._key(*creds)
        if key in self._good:
            return True
        if key in self._bad:
            return False
        return None

    def _order(self, key: bytes, prior: int, seq: int) -> tuple[int, int, int]:
        """Lower is served sooner."""
        return (0 if key in self._turned_away else 1, prior, -seq)

    async def check(self, header: str | None, client: str) -> bool | None:
        """The verdict; None when the check was turned away (answer 429, try later)."""
        quick = self.known(header)
        if quick is not None:
            return quick
        creds = self._decode(header)
        assert creds is not None
        key = self._key(*creds)
        running = self._inflight.get(key)
        if running is not None:  # the same credentials, checked now: share the answer
            return await asyncio.shield(running)
        self._seq += 1
        prior = self._seen.get(client, -1)
        self._seen[client] = self._seq
        self._seen.move_to_end(client)
        while len(self._seen) > BAD_CREDENTIALS_REMEMBERED:
            self._seen.popitem(last=False)
        # credentials turned away once (a scraper retrying) pass the address's limit: a flood from
        # the scraper's own address (one host) would otherwise hold its two places for good while
        # the budget makes each check wait
        crowded = self._pending[client] >= BCRYPT_PENDING_PER_CLIENT and key not in self._turned_away
        if crowded or not self._admit(key, prior):
            self._turned_away[key] = None
            while len(self._turned_away) > BAD_CREDENTIALS_REMEMBERED:
                self._turned_away.popitem(last=False)
            return None
        future: asyncio.Future[bool | None] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Check(client, key, creds, future, self._seq, prior))
        self._pending[client] += 1
        self._inflight[key] = future
        self._dispatch()
        try:
            return await asyncio.shield(future)
        finally:
            self._pending[client] -= 1
            if not self._pending[client]:
                del self._pending[client]
            if self._inflight.get(key) is future:
                del self._inflight[key]

    def _admit(self, key: bytes, prior: int) -> bool:
        """Room in the queue, made if need be by turning away the check that would go last."""
        if len(self._waiting) < BCRYPT_QUEUE:
            return True
        last = max(self._waiting, key=lambda c: self._order(c.key, c.prior, c.seq))
        if self._order(key, prior, self._seq) >= self._order(last.key, last.prior, last.seq):
            return False
        self._waiting.remove(last)
        self._turned_away[last.key] = None
        if not last.future.done():
            last.future.set_result(None)
        return True

    def _dispatch(self) -> None:
        while self._running < BCRYPT_THREADS and self._waiting:
            now = self._monotonic()
            if not self.budget.allows(now):  # the checks wait (bounded: BCRYPT_QUEUE) for the refill
                if self._refill is None:
                    wait = self.budget.retry_after_s(now)
                    self._refill = asyncio.get_running_loop().call_later(wait, self._refilled)
                return
            job = min(self._waiting, key=lambda c: self._order(c.key, c.prior, c.seq))
            self._waiting.remove(job)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    BCRYPT_THREADS, thread_name_prefix="gpumon-bcrypt", initializer=_lowest_priority
                )
            self._running += 1
            done = asyncio.get_running_loop().run_in_executor(self._pool, self._timed_bcrypt, *job.creds)
            done.add_done_callback(functools.partial(self._checked, job))

    def _refilled(self) -> None:
        self._refill = None
        if not self._pool_closed:
            self._dispatch()

    def _timed_bcrypt(self, user: str, password: bytes) -> tuple[bool, float]:
        """On the bcrypt thread: the verdict, and the thread's CPU it took."""
        start = time.thread_time()
        ok = self._bcrypt(user, password)
        return ok, time.thread_time() - start

    def _checked(self, job: _Check, f: asyncio.Future[tuple[bool, float]]) -> None:
        self._running -= 1
        ok = False
        if not f.cancelled() and f.exception() is None:
            ok, cpu_s = f.result()
            self.budget.charge(cpu_s, self._monotonic())
        user = job.creds[0]
        if ok:
            self._good[job.key] = user
        else:
            self._bad[job.key] = None
            while len(self._bad) > BAD_CREDENTIALS_REMEMBERED:
                self._bad.popitem(last=False)
        self._turned_away.pop(job.key, None)
        if not job.future.done():
            job.future.set_result(ok)
        if not self._pool_closed:
            self._dispatch()

    _pool_closed = False

    def _bcrypt(self, user: str, password: bytes) -> bool:
        # here, not at the top: basic auth only
        import bcrypt

        hashed = self._users.get(user)
        target = hashed if hashed is not None else self._dummy_hash()
        try:
            ok = bool(bcrypt.checkpw(password, target))
        except ValueError:  # over 72 bytes (bcrypt >= 5 refuses them) or a broken hash
            ok = False
        return ok and hashed is not None

    def _dummy_hash(self) -> bytes:
        """A hash with the cost of the configured ones, for unknown users (made once)."""
        if self._dummy is None:
            # here, not at the top: basic auth only
            import bcrypt

            cost = int(next(iter(self._users.values()))[4:6])
            self._dummy = bcrypt.hashpw(os.urandom(16), bcrypt.gensalt(rounds=cost))
        return self._dummy

    def close(self) -> None:
        """No more checks start; those waiting are turned away."""
        self._pool_closed = True
        if self._refill is not None:
            self._refill.cancel()
            self._refill = None
        for job in self._waiting:
            if not job.future.done():
                job.future.set_result(None)
        self._waiting.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


TLS_READ_BUFFER = 16 * 1024
"""What asyncio's TLS layer reads the socket into, per connection: its own default is 256 KiB, made
for bulk transfers, and a connection that never finished its handshake held it (1,500 connects
took 160 MB, 3,000 half-open ones 950 MB, never given back: found by a hostile-input pass). A
request head is at most 16 KiB, and a TLS record too."""


def _small_tls_buffers() -> None:
    """asyncio's SSLProtocol reads into a buffer of its class attribute `max_size` (Python 3.11 to
    3.13): set once for the process; a Python without it is left as it is."""
    try:
        if getattr(asyncio.sslproto.SSLProtocol, "max_size", 0) > TLS_READ_BUFFER:
            asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BUFFER
    except (AttributeError, TypeError):
        pass


def _origin_form(target: str) -> str:
    """A request target as a path and query: the absolute form (`GET http://host:9877/metrics`,
    which a server must accept, RFC 9112 3.2.2) is read as its path."""
    scheme, sep, rest = target.partition("://")
    if sep and scheme.lower() in ("http", "https") and "/" not in scheme:
        slash = rest.find("/")
        return rest[slash:] if slash >= 0 else "/" + (rest.partition("?")[1] + rest.partition("?")[2])
    return target


def _lowest_priority() -> None:
    """The bcrypt thread at nice 19 (Linux: a thread's nice is its own): a flood's checks yield to
    the training job, the sampler and the scrapes."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (OSError, AttributeError):
        pass


class _Handshake:
    """A connection accepted and not yet a client's (`_client`): in its TLS handshake, if TLS."""

    __slots__ = ("born", "since", "started", "task")

    def __init__(self) -> None:
        self.since = time.monotonic()
        self.task: asyncio.Task[None] | None = None
        self.started = False
        """True once its task runs (one cancelled before would never close its socket)."""
        self.born = False
        """True once its `_client` is made (the handshake done): no longer one to close."""


class _Conn:
    """One client connection's bookkeeping, for the eviction rule."""

    __slots__ = ("complete", "since", "writer")

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.since = time.monotonic()
        self.complete = False
        """False while waiting for a whole request head (the ones evicted first)."""


class WebServer:
    def __init__(
        self,
        address: tuple[str, int],
        routes: Routes,
        web: WebConfig,
        max_connections: int = 4096,
        timeout_s: float = 10.0,
        keepalive_s: float = 75.0,
        max_handshakes: int = MAX_HANDSHAKES,
        handshake_floor_s: float | None = None,
    ) -> None:
        self.routes = routes
        self.timeout_s = timeout_s
        self.keepalive_s = keepalive_s
        self.max_connections = _raise_fd_limit(max_connections)
        self.max_handshakes = max(1, min(max_handshakes, self.max_connections))
        # by default HANDSHAKE_FLOOR_S, but at a low limit no longer than the eviction budget takes to
        # go through them all: 1 s would cap accepting at max_handshakes a second under a flood
        self.handshake_floor_s = (
            min(HANDSHAKE_FLOOR_S, self.max_handshakes / EVICTIONS_PER_S)
            if handshake_floor_s is None
            else handshake_floor_s
        )
        self._web = web
        self._ssl = web.ssl_context() if web.tls else None
        _small_tls_buffers()
        self.auth = Authenticator(web.users)
        self._conns: dict[asyncio.StreamWriter, _Conn] = {}
        self._waiting: collections.OrderedDict[asyncio.StreamWriter, _Conn] = collections.OrderedDict()
        """The connections waiting for a whole request head, longest waiting first: eviction takes
        the first, in O(1) (a scan of every connection on each accept cost a core at the limit)."""
        self._idle: collections.OrderedDict[asyncio.StreamWriter, _Conn] = collections.OrderedDict()
        """Served connections waiting, with nothing sent yet, for their next request (keep-alive),
        idle longest first: evicted only when no connection is in `_waiting`."""
        self.evicted = 0
        self.refused = 0
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._listening: list[socket.socket] = []
        self._unborn = 0
        """Connections accepted whose `_client` has not started yet (they count against the limit)."""
        self._handshakes: collections.OrderedDict[_Handshake, None] = collections.OrderedDict()
        """Those of them still in their handshake, the oldest first (closed first, past
        `max_handshakes` or at `max_connections`)."""
        self._evict_tokens = EVICTIONS_PER_S
        self._tokens_at = 0.0
        self._paused: asyncio.TimerHandle | None = None
        self._waiting_for_handshakes = False
        """Accepting is paused until a handshake under way ends (all were younger than the floor)."""
        host, port = address
        try:
            self._sockets = _bind(host, port)
        except OSError as e:
            raise WebConfigError(f"listen {host or '*'}:{port}: {e.strerror}") from None

    @property
    def port(self) -> int:
        return int(self._sockets[0].getsockname()[1])

    def start(self) -> None:
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self._loop)

            async def serve() -> None:
                # accepted here rather than by asyncio.start_server, whose passes take up to its
                # backlog at once and cannot be paused: at the limit, accepting waits its turn
                for sock in self._sockets:
                    sock.setblocking(False)
                    sock.listen(LISTEN_BACKLOG)
                    self._loop.add_reader(sock.fileno(), self._accept, sock)
                    self._listening.append(sock)
                self._tokens_at = self._loop.time()
                ready.set()

            self._loop.run_until_complete(serve())
            self._loop.run_forever()

        self._thread = named_thread(run, "gpumon-http")
        self._thread.start()
        ready.wait(10)

    def _ssl_for_new_connections(self) -> ssl.SSLContext | None:
        return self._ssl

    def _accept(self, sock: socket.socket) -> None:
        """The listening socket is readable: up to ACCEPT_BATCH connections, each handed to asyncio
        as start_server would; at the limit (of connections, or of handshakes), only as many as the
        eviction budget allows, each closing another as it comes."""
        loop = self._loop
        for _ in range(ACCEPT_BATCH):
            full = len(self._conns) + self._unborn >= self.max_connections
            crowded = len(self._handshakes) >= self.max_handshakes
            if crowded and (young := self._youngest_to_close()) > 0:
                # every handshake under way began within handshake_floor_s: a burst of real clients
                # (a slow network), none of them yet a crowd's. The newcomers wait in the kernel's
                # backlog until one finishes (_handshake_over) or grows old enough to be closed.
                self._pause_accepting(young)
                self._waiting_for_handshakes = True
                return
            if (full or crowded) and not self._may_evict(loop.time()):
                self._pause_accepting((1.0 - self._evict_tokens) / EVICTIONS_PER_S)
                return
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as e:  # out of file descriptors, or of memory: try again in a while
                log.warning("accepting connections: %s; trying again in 1 s", e.strerror)
                self._pause_accepting(1.0)
                return
            conn.setblocking(False)
            oldest = self._oldest_handshake() if crowded else None
            if oldest is not None:
                self._end_handshake(oldest)
            elif full:
                self._make_room()
            handshake = _Handshake()  # counted now: a batch's accepts come before their tasks run
            self._handshakes[handshake] = None
            self._unborn += 1
            handshake.task = loop.create_task(self._connected(conn, handshake))

    def _make_room(self) -> None:
        """At `max_connections`: close the connection that has waited longest without sending a
        whole request, whether in its handshake or waiting for its head (one that never finishes
        its handshake never reaches `_client`, where room is made otherwise). A served one idle is
        left to `_client`'s turn: connections accepted a moment ago may be about to wait for
        their heads, and go before it."""
        handshake = self._oldest_handshake()
        waiting = next(iter(self._waiting.values()), None)
        if handshake is not None and (waiting is None or handshake.since <= waiting.since):
            self._end_handshake(handshake)
        elif waiting is not None:
            self._evict()

    def _youngest_to_close(self) -> float:
        """How long until the oldest handshake under way may be closed for a newcomer (0: now)."""
        oldest = self._oldest_handshake()
        return 0.0 if oldest is None else self.handshake_floor_s - (time.monotonic() - oldest.since)

    def _oldest_handshake(self) -> _Handshake | None:
        """The connection longest in its handshake (those just through it leave the list)."""
        while self._handshakes:
            handshake = next(iter(self._handshakes))
            if not handshake.born:
                return handshake
            del self._handshakes[handshake]  # (its `_client` counts it off)
        return None

    def _end_handshake(self, handshake: _Handshake) -> None:
        """Close a connection in its handshake, for a newcomer (one whose task has not started
        yet closes its socket when it starts)."""
        del self._handshakes[handshake]
        self._unborn -= 1
        self.evicted += 1
        if handshake.started and handshake.task is not None:
            handshake.task.cancel()  # asyncio closes its transport

    def _may_evict(self, now: float) -> bool:
        """One token of the eviction budget, if there is one (it refills at EVICTIONS_PER_S)."""
        self._evict_tokens = min(
            EVICTIONS_PER_S, self._evict_tokens + (now - self._tokens_at) * EVICTIONS_PER_S
        )
        self._tokens_at = now
        if self._evict_tokens < 1.0:
            return False
        self._evict_tokens -= 1.0
        return True

    def _pause_accepting(self, seconds: float) -> None:
        if self._paused is not None:
            return
        for sock in self._listening:
            self._loop.remove_reader(sock.fileno())
        self._paused = self._loop.call_later(max(0.001, seconds), self._resume_accepting)

    def _resume_accepting(self) -> None:
        self._paused = None
        self._waiting_for_handshakes = False
        for sock in self._listening:
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    async def _connected(self, conn: socket.socket, handshake: _Handshake) -> None:
        """A new connection as asyncio.start_server makes one: a stream and `_client`'s task."""
        if handshake not in self._handshakes:  # closed for a newcomer before this began
            conn.close()
            return
        handshake.started = True
        loop = self._loop

        def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Awaitable[None] | None:
            if handshake not in self._handshakes:
                return None  # closed for a newcomer as it connected (its transport is closing): no client
            handshake.born = True
            return self._client(reader, writer)

        reader = asyncio.StreamReader(limit=MAX_HEADER_BYTES * 2, loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, client, loop=loop)
        try:
            await loop.connect_accepted_socket(
                lambda: protocol,
                sock=conn,
                ssl=self._ssl_for_new_connections(),
                ssl_handshake_timeout=self.timeout_s if self._ssl else None,
            )
        except (OSError, ssl.SSLError, TimeoutError, asyncio.CancelledError):
            # a handshake that failed or never came, one closed for a newcomer, the server stopping
            if handshake in self._handshakes:  # (not one closed for a newcomer: counted off then)
                del self._handshakes[handshake]
                if not handshake.born:
                    self._unborn -= 1  # no `_client` for it
            conn.close()
        else:
            self._handshakes.pop(handshake, None)
        if self._waiting_for_handshakes and self._paused is not None:  # room for the next at once
            self._paused.cancel()
            self._resume_accepting()

    def reconfigure(self, web: WebConfig) -> None:
        """SIGHUP: new users, certificates and TLS settings (versions, ciphers, client CA) apply to
        new connections (TLS turned on or off takes a restart: the daemon says so)."""
        ctx = web.ssl_context() if web.tls else None

        def apply() -> None:
            self._web = web
            self.auth.close()
            self.auth = Authenticator(web.users, previous=self.auth)
            if ctx is not None and self._ssl is not None:
                # each accepted connection is wrapped with the context of the moment: the new one,
                # whole (loading only the new certificate into the old one kept its min_version)
                self._ssl = ctx

        self._loop.call_soon_threadsafe(apply)

    def stop(self) -> None:
        """Stop listening, end every connection and the event loop (within about a second)."""
        if self._thread is not None and self._thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(1.5)
            except Exception:  # a stuck client must not hold up a stop: the loop ends anyway
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(2)
            if not self._thread.is_alive():
                self._loop.close()
        else:
            for s in self._sockets:
                s.close()
        self.auth.close()

    async def _shutdown(self) -> None:
        loop = asyncio.get_running_loop()

        def quiet_cancel(lp: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            # Python 3.11's start_server callback asks a connection's task for its exception, and
            # one cancelled before its first step raises there: a traceback per connection that
            # was just accepted when the server stopped (a crowd's, at the connection limit)
            if not isinstance(context.get("exception"), asyncio.CancelledError):
                lp.default_exception_handler(context)

        loop.set_exception_handler(quiet_cancel)
        if self._paused is not None:
            self._paused.cancel()
            self._paused = None
        for sock in self._listening:
            loop.remove_reader(sock.fileno())
            sock.close()
        self._listening = []
        for writer in list(self._conns):
            writer.close()
        me = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not me]
        for t in tasks:
            t.cancel()
        await asyncio.wait(tasks, timeout=1.0) if tasks else None

    # -- one connection ----------------------------------------------------------------------------

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._unborn = max(0, self._unborn - 1)
        sock = writer.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if len(self._conns) >= self.max_connections and not self._evict():
            self.refused += 1
            writer.write(_raw(503, "too many clients: try again\n"))
            await _close(writer)
            return
        if not self._allowed_san(writer):
            writer.write(_raw(403, "client certificate not allowed\n"))
            await _close(writer)
            return
        conn = _Conn(writer)
        self._conns[writer] = conn
        self._waiting[writer] = conn
        peer = writer.get_extra_info("peername")
        client = str(peer[0]) if isinstance(peer, tuple) else "?"
        try:
            await self._serve(reader, writer, conn, client)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, TimeoutError, OSError):
            pass  # the client went away or misbehaved at the transport level: nothing to log
        except asyncio.CancelledError:
            pass  # the server is stopping
        finally:
            self._conns.pop(writer, None)
            self._waiting.pop(writer, None)
            self._idle.pop(writer, None)
            await _close(writer)

    def _evict(self) -> bool:
        """Close the connection that has waited longest for a whole request head; when every
        connection has been served, the one idle longest."""
        queue = self._waiting or self._idle
        if not queue:
            return False
        _, oldest = queue.popitem(last=False)
        self._conns.pop(oldest.writer, None)
        oldest.writer.close()
        self.evicted += 1
        return True

    def _allowed_san(self, writer: asyncio.StreamWriter) -> bool:
        sans = self._web.client_allowed_sans
        if not sans:
            return True
        cert = writer.get_extra_info("peercert") or {}
        names = {
            value
            for kind, value in cert.get("subjectAltName", ())
            if kind in ("DNS", "IP Address", "email", "URI")
        }
        return bool(names & set(sans))

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: _Conn, client: str
    ) -> None:
        h = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        served = False
        while True:
            conn.complete = False
            conn.since = time.monotonic()
            # the newest to wait in its queue: evicted last in it
            (self._idle if served else self._waiting)[writer] = conn
            try:
                request = await self._next_request(h, reader, writer, conn, served)
            except h11.RemoteProtocolError as e:
                status = e.error_status_hint if e.error_status_hint in (400, 413, 414, 431) else 400
                why = str(e).split(": bytearray(", 1)[0]  # (h11 quotes the bytes as Python writes them)
                writer.write(_raw(status, f"bad request: {why}\n"))
                await _drain(writer, self.timeout_s)
                return
            if request is None:
                return  # closed, or the deadline for the request head passed
            conn.complete = served = True
            self._waiting.pop(writer, None)
            self._idle.pop(writer, None)
            try:
                response, close = await self._respond(request, h, client)
            except Exception:  # a bug of gpumon's: this client gets a 500, the daemon serves on
                log.exception("http: internal error answering %r", request.target[:200])
                response, close = _text(500, "internal error (see gpumon's log)"), True
            data = self._encode(h, request, response, close)
            writer.write(data)
            await _drain(writer, self.timeout_s)
            if close or h.our_state is h11.MUST_CLOSE:
                return
            try:
                if h.their_state is h11.SEND_BODY and not isinstance(h.next_event(), h11.EndOfMessage):
                    return  # (a bodiless request ends at once; anything else was refused above)
                h.start_next_cycle()
            except (h11.LocalProtocolError, h11.RemoteProtocolError):
                return

    async def _next_request(
        self,
        h: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        conn: _Conn,
        served: bool,
    ) -> h11.Request | None:
        """The next request's head: within `timeout_s`, or for a served connection (keep-alive)
        within `keepalive_s` of idling and then `timeout_s` from its first byte, when it also
        joins the connections evicted first (a served client may trickle no more than a new one)."""
        loop = asyncio.get_running_loop()
        idle = served
        deadline = loop.time() + (self.keepalive_s if idle else self.timeout_s)
        while True:
            event = h.next_event()
            if isinstance(event, h11.Request):
                size = len(event.target) + sum(len(k) + len(v) + 4 for k, v in event.headers)
                if size > MAX_HEADER_BYTES:  # a whole head that arrived at once is held to it too
                    raise h11.RemoteProtocolError("request head too large", error_status_hint=431)
                return event
            if event is h11.PAUSED or isinstance(event, h11.ConnectionClosed):
                return None
            if event is h11.NEED_DATA:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return None
                try:
                    data = await asyncio.wait_for(reader.read(8192), remaining)
                except TimeoutError:
                    return None
                if idle and data:
                    idle = False
                    deadline = loop.time() + self.timeout_s
                    self._idle.pop(writer, None)
                    self._waiting[writer] = conn
                h.receive_data(data)  # b"" marks the end of the stream
                continue
            return None  # data before a request: not a request we serve

    async def _respond(self, request: h11.Request, h: h11.Connection, client: str) -> tuple[Response, bool]:
        """The response, and whether to close the connection after it."""
        method = request.method.decode("ascii", "replace")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in request.headers}
        if method not in ("GET", "HEAD"):
            return _text(405, "only GET and HEAD", (("Allow", "GET, HEAD"),)), True
        length = headers.get("content-length")
        if "transfer-encoding" in headers or (length is not None and length.strip() != "0"):
            return _text(413, "requests carry no body"), True
        verdict = await self.auth.check(headers.get("authorization"), client)
        if verdict is None:
            return _text(
                429, "too many authentication attempts: try again later", (("Retry-After", "1"),)
            ), True
        if not verdict:
            return _text(401, "unauthorized", (("WWW-Authenticate", 'Basic realm="gpumon"'),)), False
        target = _origin_form(request.target.decode("latin-1"))
        path = target.split("?", 1)[0]
        gz = accepts_gzip(headers.get("accept-encoding", ""))
        routes = self.routes
        if path == "/metrics":
            body, ctype, encoding = routes.metrics(headers.get("accept", ""), gz)
            return Response(200, body, ctype, encoding=encoding), False
        if path == "/metrics/pcp" and routes.pcp is not None:
            return Response(200, routes.pcp(), "text/plain; charset=utf-8"), False
        if path == "/api/v1/state":
            import json  # loaded at the state API's first request, not before the first sample

            return Response(200, json.dumps(routes.state()).encode(), "application/json"), False
        if path == "/api/v1/analysis" and routes.analysis is not None:
            query = target.partition("?")[2]
            status, body, extra = await routes.analysis(query, client)
            return Response(status, body, "application/json", headers=extra), False
        if path in ("/healthz", "/-/healthy"):
            ok, why = routes.health()
            return _text(200 if ok else 503, why), False
        if path == "/":
            return Response(200, routes.landing().encode(), "text/html; charset=utf-8"), False
        return _text(404, "not found: try /metrics, /api/v1/state or /healthz"), False

    def _encode(self, h: h11.Connection, request: h11.Request, r: Response, close: bool) -> bytes:
        body, encoding = r.body, r.encoding
        gz = accepts_gzip(_header(request, b"accept-encoding"))
        if encoding is None and gz and len(body) >= GZIP_MIN_BYTES:
            body, encoding = gzip.compress(body, compresslevel=5, mtime=0), "gzip"
        headers = [
            ("Content-Type", r.content_type),
            ("Content-Length", str(len(body))),
            ("Cache-Control", "no-store"),
            ("Server", "gpumon"),
            *r.headers,
            *self._web.headers,
        ]
        if encoding is not None:
            headers.append(("Content-Encoding", encoding))
        if r.encoding is not None or len(r.body) >= GZIP_MIN_BYTES:
            headers.append(("Vary", "Accept-Encoding"))
        if close:
            headers.append(("Connection", "close"))
        out = h.send(h11.Response(status_code=r.status, headers=headers, reason=_reason(r.status))) or b""
        if request.method != b"HEAD":
            out += h.send(h11.Data(data=body)) or b""
        out += h.send(h11.EndOfMessage()) or b""
        return out


def _reason(status: int) -> bytes:
    """The status line's reason phrase ("OK"; b"" for a code without one)."""
    if status == 200:
        return b"OK"
    from http import HTTPStatus  # its table (an enum of 60 codes) only when something fails

    return HTTPStatus(status).phrase.encode() if status in HTTPStatus._value2member_map_ else b""


def _header(request: h11.Request, name: bytes) -> str:
    for k, v in request.headers:
        if k == name:
            return str(v.decode("latin-1"))
    return ""


_REASONS = {
    400: "Bad Request",
    403: "Forbidden",
    413: "Content Too Large",
    414: "URI Too Long",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


def _raw(status: int, body: str) -> bytes:
    """A response written outside h11's state machine (the request could not be parsed)."""
    data = body.encode()
    return (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\nServer: gpumon\r\n\r\n"
    ).encode() + data


async def _drain(writer: asyncio.StreamWriter, timeout_s: float) -> None:
    await asyncio.wait_for(writer.drain(), timeout_s)


async def _close(writer: asyncio.StreamWriter) -> None:
    try:
        writer.close()
        await asyncio.wait_for(writer.wait_closed(), 1.0)
    except (ConnectionError, OSError, ssl.SSLError, TimeoutError):
        pass


def _bind(host: str, port: int) -> list[socket.socket]:
    """Listening sockets: one for an address; for an empty host, one dual-stack IPv6 socket that
    takes IPv4 too (or an IPv4 one where the machine has no IPv6)."""
    if host in ("", "*"):
        if socket.has_ipv6:
            try:
                s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                s.bind(("::", port))
                s.listen(LISTEN_BACKLOG)
                s.setblocking(False)
                return [s]
            except OSError:
                s.close()
        host = "0.0.0.0"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # an ASCII name as bytes: a str is encoded by the idna codec, whose import (stringprep,
    # unicodedata) was ~2 ms of every start before the first sample could be served
    name: str | bytes = host.encode("ascii") if host.isascii() else host
    infos = socket.getaddrinfo(name, port, family, socket.SOCK_STREAM) if family == socket.AF_INET else None
    addr: tuple[Any, ...] = infos[0][4] if infos else (host, port)
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(addr)
        s.listen(LISTEN_BACKLOG)
        s.setblocking(False)
    except OSError:
        s.close()
        raise
    return [s]


def _raise_fd_limit(max_connections: int) -> int:
    """Make room for `max_connections` sockets (the soft limit is often 1024); when the hard
    limit is lower, serve as many as it allows and say so."""
    need = max_connections + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        new = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < need:
        allowed = max(1, soft - 64)
        log.warning(
            "max_connections %d needs %d open files but the limit is %d: serving at most %d clients",
            max_connections,
            need,
            soft,
            allowed,
        )
        return allowed
    return max_connections
