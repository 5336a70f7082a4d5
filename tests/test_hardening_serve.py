"""The daemon's new surfaces under attack (issue 28, items 10-12): a flood of wrong passwords from
many addresses never shuts a real scraper out (at start, or across a reload), eviction above
max_connections costs O(1), and the analysis API and `--check-config` refuse what they must, with
the right status or exit code."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest

from gpumon.serve.webconfig import load_web_config

from .test_hardening_auth import ROUNDS, basic, daemon_with, get

FLOODERS = 64


class Flood:
    """`FLOODERS` threads, each from its own loopback address, sending a new wrong password on
    every request, as fast as the server answers."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stop = threading.Event()
        self.sent = 0
        self.refused = 0
        self.threads = [threading.Thread(target=self._run, args=(n,), daemon=True) for n in range(FLOODERS)]
        for t in self.threads:
            t.start()

    def _run(self, n: int) -> None:
        i = 0
        while not self.stop.is_set():
            i += 1
            try:
                status = get(self.port, basic("prometheus", f"guess-{n}-{i}".encode()), f"127.0.0.{n + 2}")
                self.sent += 1
                self.refused += status == 429
            except OSError:
                pass

    def saturating(self, timeout_s: float = 60.0) -> bool:
        """The flood is turning requests away: the bcrypt queue is full."""
        deadline = time.monotonic() + timeout_s
        while self.refused < 50 and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.refused >= 50

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(10)


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[object, int, Path]]:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=ROUNDS)).decode()
    d, port = daemon_with(f"basic_auth_users:\n  prometheus: '{hashed}'\n", tmp_path)
    yield d, port, tmp_path / "web.yml"
    d.stop()


def test_a_flood_from_64_addresses_right_after_start_never_shuts_the_scraper_out(
    secured: tuple[object, int, Path],
) -> None:
    _, port, _ = secured
    flood = Flood(port)  # the daemon has just started: no credentials checked yet
    try:
        assert flood.saturating(), "the flood never filled the queue"
        codes = [get(port, basic("prometheus", b"s3cret"), "127.0.0.1") for _ in range(32)]
    finally:
        flood.close()
    assert codes == [200] * 32, f"{codes.count(429)} of 32 scrapes refused; {flood.sent} wrong guesses ran"


def test_a_reload_mid_flood_keeps_the_scraper_served(secured: tuple[object, int, Path]) -> None:
    d, port, web = secured
    assert get(port, basic("prometheus", b"s3cret")) == 200
    flood = Flood(port)
    codes = []
    try:
        assert flood.saturating()
        for i in range(32):
            if i % 8 == 0:
                d.web.reconfigure(load_web_config(str(web)))  # type: ignore[attr-defined]  # SIGHUP
            codes.append(get(port, basic("prometheus", b"s3cret"), "127.0.0.1"))
    finally:
        flood.close()
    assert codes == [200] * 32, f"{codes.count(429)} of 32 scrapes refused"


def test_a_reload_that_changes_the_password_forgets_the_old_one(secured: tuple[object, int, Path]) -> None:
    d, port, web = secured
    assert get(port, basic("prometheus", b"s3cret")) == 200  # remembered as good
    new = bcrypt.hashpw(b"n3w", bcrypt.gensalt(rounds=ROUNDS)).decode()
    web.write_text(f"basic_auth_users:\n  prometheus: '{new}'\n")
    d.web.reconfigure(load_web_config(str(web)))  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    while get(port, basic("prometheus", b"s3cret")) != 401:  # applied on the event loop
        assert time.monotonic() < deadline, "the old password still lets in"
        time.sleep(0.05)
    assert get(port, basic("prometheus", b"n3w")) == 200


def test_against_endless_new_addresses_a_scraper_is_turned_away_once_at_most() -> None:
    """With more flooding addresses than the queue holds, every one of them new, the scraper may
    be turned away once; its retry comes before every first try."""
    from gpumon.serve import http as http_mod

    auth = http_mod.Authenticator({"prometheus": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4))})
    release = threading.Event()
    real = auth._bcrypt

    def slow(user: str, password: bytes) -> bool:
        release.wait(10)  # the threads are busy until every request below has arrived
        return real(user, password)

    auth._bcrypt = slow  # type: ignore[method-assign]

    def header(password: bytes) -> str:
        return "Basic " + base64.b64encode(b"prometheus:" + password).decode()

    def flood(prefix: str, n: int) -> list[asyncio.Future[bool | None]]:
        return [
            asyncio.ensure_future(
                auth.check(header(f"{prefix}{i}".encode()), f"10.{prefix}.{i // 250}.{i % 250}")
            )
            for i in range(n)
        ]

    async def scenario() -> tuple[bool | None, bool | None]:
        before = flood("1", http_mod.BCRYPT_QUEUE + http_mod.BCRYPT_THREADS)
        await asyncio.sleep(0)
        first = asyncio.ensure_future(auth.check(header(b"s3cret"), "192.0.2.1"))
        after = flood("2", 3 * http_mod.BCRYPT_QUEUE)  # newer still: they may push it out
        await asyncio.sleep(0)
        release.set()
        got = await first
        retry = None if got else await auth.check(header(b"s3cret"), "192.0.2.1")
        await asyncio.gather(*before, *after)
        return got, retry

    got, retry = asyncio.run(scenario())
    auth.close()
    assert got is True or retry is True, (got, retry)


def test_a_flood_of_wrong_passwords_gets_bcrypt_only_within_its_cpu_budget() -> None:
    """bcrypt's CPU is charged to a bucket: while it is empty, checks wait for the refill rather
    than run (two bcrypt threads at the default priority took 1.5 cores of a GPU node from its
    training job under a flood of wrong passwords: found by a hostile-input pass). A scraper's
    known credentials cost nothing whatever the bucket holds."""
    from gpumon.serve import http as http_mod

    clock = [1000.0]
    auth = http_mod.Authenticator(
        {"prometheus": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4))}, monotonic=lambda: clock[0]
    )
    ran: list[bytes] = []

    def costly(user: str, password: bytes) -> tuple[bool, float]:
        ran.append(password)
        return password == b"s3cret", 0.5  # each check "took" half a CPU-second

    auth._timed_bcrypt = costly  # type: ignore[method-assign]

    def header(password: bytes) -> str:
        return "Basic " + base64.b64encode(b"prometheus:" + password).decode()

    async def settled() -> None:
        """Until no check runs on the bcrypt thread (what is left waits for the bucket)."""
        for _ in range(2000):
            await asyncio.sleep(0.005)
            if auth._running == 0:
                return

    async def scenario() -> tuple[int, int, bool | None]:
        assert await auth.check(header(b"s3cret"), "192.0.2.1") is True  # checked once, remembered
        flood = [
            asyncio.ensure_future(auth.check(header(f"wrong{i}".encode()), f"10.0.0.{i}")) for i in range(10)
        ]
        await settled()
        while_spent = len(ran)
        known = await auth.check(header(b"s3cret"), "192.0.2.1")  # no bcrypt: answered at once
        clock[0] += 10.0  # 1 CPU-second refilled at 10% of a core
        auth._dispatch()
        await settled()
        after_refill = len(ran)
        auth.close()
        await asyncio.gather(*flood)
        return while_spent, after_refill, known

    while_spent, after_refill, known = asyncio.run(scenario())
    burst = int(http_mod.BCRYPT_BURST_CPU_S / 0.5)
    assert while_spent == burst, "the burst's worth of checks, then they wait"
    assert after_refill == while_spent + 2, "a refill's worth more"
    assert known is True


def test_a_scraper_flooded_from_its_own_address_is_checked_on_its_retry() -> None:
    """The flood holds the address's two pending places while the budget makes each check wait;
    credentials turned away once pass that limit (and come first), so a scraper on the flooding
    host is answered on its retry (it was turned away on every try: measured against a real
    daemon, 20 flooding threads and a scraper on one host)."""
    from gpumon.serve import http as http_mod

    clock = [1000.0]
    auth = http_mod.Authenticator(
        {"prometheus": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4))}, monotonic=lambda: clock[0]
    )

    def costly(user: str, password: bytes) -> tuple[bool, float]:
        return password == b"s3cret", 0.5

    auth._timed_bcrypt = costly  # type: ignore[method-assign]

    def header(password: bytes) -> str:
        return "Basic " + base64.b64encode(b"prometheus:" + password).decode()

    async def scenario() -> tuple[bool | None, bool | None]:
        auth.budget.charge(5.0, clock[0])  # spent by the flood so far
        flood = [asyncio.ensure_future(auth.check(header(f"w{i}".encode()), "10.0.0.1")) for i in range(2)]
        await asyncio.sleep(0)  # the flood's two places taken, waiting for the refill
        first = await auth.check(header(b"s3cret"), "10.0.0.1")  # the same address: no place left
        retry = asyncio.ensure_future(auth.check(header(b"s3cret"), "10.0.0.1"))
        await asyncio.sleep(0)
        clock[0] += 60.0  # the bucket refills: the retry goes first
        auth._dispatch()
        got = await asyncio.wait_for(retry, 10)
        auth.close()
        await asyncio.gather(*flood)
        return first, got

    first, got = asyncio.run(scenario())
    assert first is None and got is True
