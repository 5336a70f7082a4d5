"""Basic auth and TLS as exporter-toolkit does them: long passwords, timing that does not tell
which users exist, bcrypt that a flood of wrong passwords cannot turn against real scrapers, and
every web config key honoured or refused."""

from __future__ import annotations

import base64
import http.client
import os
import ssl
import subprocess
import threading
import time
from pathlib import Path

import bcrypt
import pytest

from gpumon.config.settings import Config
from gpumon.core.clock import VirtualClock
from gpumon.serve.daemon import Daemon
from gpumon.serve.webconfig import WebConfigError, load_web_config

ROUNDS = 9


def daemon_with(web_yaml: str, tmp_path: Path) -> tuple[Daemon, int]:
    web = tmp_path / "web.yml"
    web.write_text(web_yaml)
    d = Daemon(
        Config(simulate="healthy", listen="127.0.0.1:0", web_config_file=str(web)), clock=VirtualClock()
    )
    d.sampler.run(duration_s=3)
    return d, d.start_http_only()


def basic(user: str, password: bytes, scheme: str = "Basic") -> str:
    return f"{scheme} " + base64.b64encode(user.encode() + b":" + password).decode()


def get(port: int, auth: str | None, source: str = "") -> int:
    c = http.client.HTTPConnection(
        "127.0.0.1", port, timeout=30, source_address=(source, 0) if source else None
    )
    try:
        c.request("GET", "/metrics", headers={"Authorization": auth} if auth else {})
        r = c.getresponse()
        r.read()
        return r.status
    finally:
        c.close()


@pytest.fixture
def authed(tmp_path: Path):
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=ROUNDS)).decode()
    other = bcrypt.hashpw(b"0ther", bcrypt.gensalt(rounds=ROUNDS)).decode()
    d, port = daemon_with(f"basic_auth_users:\n  prometheus: '{hashed}'\n  grafana: '{other}'\n", tmp_path)
    yield port
    d.stop()


def test_a_password_over_72_bytes_is_a_401_not_a_dropped_connection(authed: int) -> None:
    assert get(authed, basic("prometheus", b"x" * 100)) == 401
    assert get(authed, basic("prometheus", b"s3cret")) == 200


def test_the_scheme_name_is_case_insensitive(authed: int) -> None:
    assert get(authed, basic("prometheus", b"s3cret", "basic")) == 200
    assert get(authed, basic("prometheus", b"s3cret", "BASIC")) == 200
    assert get(authed, basic("prometheus", b"s3cret", "Bearer")) == 401


def test_an_unknown_user_costs_as_much_as_a_wrong_password(
    authed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the same work, so the same time: one bcrypt check each, against a hash of the same cost.
    # Counted (the daemon runs in this process), not timed: medians of 7 timings, 111 ms against
    # 314 ms, failed beside two CPU hogs
    checked: list[bytes] = []
    real_checkpw = bcrypt.checkpw

    def counting_checkpw(password: bytes, hashed: bytes) -> bool:
        checked.append(hashed)
        return bool(real_checkpw(password, hashed))

    monkeypatch.setattr(bcrypt, "checkpw", counting_checkpw)
    for user in ("nobody", "prometheus"):
        for i in range(3):
            checked.clear()
            assert get(authed, basic(user, f"wrong-{user}-{i}".encode())) == 401  # a new password each time
            costs = [int(h.split(b"$")[2]) for h in checked]
            assert costs == [ROUNDS], (user, costs)


def test_a_flood_of_wrong_passwords_does_not_starve_real_scrapes(
    authed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert get(authed, basic("prometheus", b"s3cret")) == 200  # the scraper's credentials, once checked
    checked: list[bytes] = []  # every password bcrypt checked (the daemon runs in this process)
    real_checkpw = bcrypt.checkpw

    def counting_checkpw(password: bytes, hashed: bytes) -> bool:
        checked.append(password)
        return bool(real_checkpw(password, hashed))

    monkeypatch.setattr(bcrypt, "checkpw", counting_checkpw)
    # bcrypt's CPU budget out of the way: it makes the flood's checks wait (tested on its own in
    # test_hardening_serve.py); here, the checks run beside the scrapes, as fast as they can
    from gpumon.serve.cpu_budget import CpuBudget

    monkeypatch.setattr(CpuBudget, "allows", lambda self, now: True)
    stop = threading.Event()

    def flood(n: int) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                get(authed, basic("prometheus", f"guess-{n}-{i}".encode()))
            except OSError:
                pass

    threads = [threading.Thread(target=flood, args=(n,), daemon=True) for n in range(64)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 60  # (bcrypt runs at nice 19: beside 64 flooding threads,
        while not checked and time.monotonic() < deadline:  # its first check may take a while)
            time.sleep(0.05)
        flood_checked = bool(checked)
        codes = [get(authed, basic("prometheus", b"s3cret")) for _ in range(20)]
        # a scraper from another address, whose credentials were never checked yet, gets in too
        fresh = get(authed, basic("grafana", b"0ther"), "127.0.0.2")
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert codes == [200] * 20 and fresh == 200
    # Not starved, whatever the machine's speed: the flood kept the password checks busy while
    # the scrapes ran, and not one scrape waited for a check (its credentials are remembered);
    # the new scraper waited for its own check only (a wall-clock limit failed on a loaded machine)
    assert flood_checked, "the flood's guesses were being checked when the scrapes began"
    assert checked.count(b"s3cret") == 0 and checked.count(b"0ther") == 1, checked.count(b"s3cret")


# -- TLS settings of the web config: honoured, or refused with exit 7 ----------------------------


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(d / "ca.key"),
        "-out",
        str(d / "ca.pem"),
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
    )
    for name in ("server", "client"):
        openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(d / f"{name}.key"),
            "-out",
            str(d / f"{name}.csr"),
            "-subj",
            f"/CN={name}",
        )
        ext = d / f"{name}.ext"
        ext.write_text(f"subjectAltName=DNS:{name}.example\n")
        openssl(
            "x509",
            "-req",
            "-in",
            str(d / f"{name}.csr"),
            "-CA",
            str(d / "ca.pem"),
            "-CAkey",
            str(d / "ca.key"),
            "-CAcreateserial",
            "-out",
            str(d / f"{name}.pem"),
            "-days",
            "1",
            "-extfile",
            str(ext),
        )
    openssl(
        "pkey",
        "-in",
        str(d / "server.key"),
        "-out",
        str(d / "encrypted.key"),
        "-aes256",
        "-passout",
        "pass:hunter2",
    )
    return d


def tls_get(port: int, pki: Path, cert: bool = True, max_version: ssl.TLSVersion | None = None) -> int:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    ctx.check_hostname = False
    if max_version is not None:
        ctx.maximum_version = max_version
    if cert:
        ctx.load_cert_chain(str(pki / "client.pem"), str(pki / "client.key"))
    c = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=ctx)
    try:
        c.request("GET", "/healthz")
        r = c.getresponse()
        r.read()
        return r.status
    finally:
        c.close()


def tls_yaml(pki: Path, extra: str = "") -> str:
    return f"tls_server_config:\n  cert_file: {pki}/server.pem\n  key_file: {pki}/server.key\n{extra}"


def test_client_certificates_are_required_when_the_file_says_so(pki: Path, tmp_path: Path) -> None:
    d, port = daemon_with(
        tls_yaml(pki, f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {pki}/ca.pem\n"),
        tmp_path,
    )
    try:
        assert tls_get(port, pki) == 200
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            tls_get(port, pki, cert=False)
    finally:
        d.stop()


def test_allowed_sans_are_checked(pki: Path, tmp_path: Path) -> None:
    extra = f"  client_ca_file: {pki}/ca.pem\n  client_allowed_sans: [other.example]\n"
    d, port = daemon_with(tls_yaml(pki, extra), tmp_path)
    try:
        assert tls_get(port, pki) == 403
    finally:
        d.stop()


def test_min_version_tls13_keeps_tls12_out(pki: Path, tmp_path: Path) -> None:
    d, port = daemon_with(tls_yaml(pki, "  min_version: TLS13\n"), tmp_path)
    try:
        assert tls_get(port, pki, cert=False) == 200
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            tls_get(port, pki, cert=False, max_version=ssl.TLSVersion.TLSv1_2)
    finally:
        d.stop()


@pytest.mark.parametrize(
    "extra,needle",
    [
        ("  client_auth_type: RequireAnyClientCert\n", "RequireAnyClientCert is not supported"),
        ("  client_auth_type: RequireAndVerifyClientCert\n", "needs client_ca_file"),
        ("  min_version: TLS14\n", "unknown 'TLS14'"),
        ("  cipher_suites: [TLS_FAKE]\n", "unknown 'TLS_FAKE'"),
        ("  curve_preferences: [CurveP256, X25519]\n", "one curve only"),
        ("  clientca_file: /x\n", "unknown key tls_server_config.'clientca_file'"),
    ],
)
def test_tls_settings_gpumon_cannot_honour_are_refused(
    pki: Path, tmp_path: Path, extra: str, needle: str
) -> None:
    web = tmp_path / "web.yml"
    web.write_text(tls_yaml(pki, extra))
    with pytest.raises(WebConfigError, match=needle) as e:
        load_web_config(str(web))
    assert e.value.exit_code == 7


def test_an_encrypted_key_is_an_error_not_a_passphrase_prompt(pki: Path, tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {pki}/server.pem\n  key_file: {pki}/encrypted.key\n")
    with pytest.raises(WebConfigError, match="is encrypted"):
        load_web_config(str(web))  # a prompt would wait on stdin (pytest's is closed): an error, not a hang


def test_configured_headers_are_sent(tmp_path: Path) -> None:
    d, port = daemon_with("http_server_config:\n  headers:\n    X-Frame-Options: deny\n", tmp_path)
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/healthz")
        r = c.getresponse()
        r.read()
        assert r.getheader("X-Frame-Options") == "deny"
    finally:
        d.stop()


def test_a_web_config_that_is_not_a_file_is_refused_unread(tmp_path: Path) -> None:
    """A FIFO would block the start (and --check-config) for ever, /dev/zero never end: only a
    regular file is read, 1 MiB at most, and the error names what stands there."""
    fifo = tmp_path / "web.yml"
    os.mkfifo(fifo)  # nobody writes to it
    for path, said in ((str(fifo), "a FIFO, not a web config file"), ("/dev/zero", "a character device")):
        with pytest.raises(WebConfigError, match=said) as e:
            load_web_config(path)
        assert e.value.exit_code == 7
    big = tmp_path / "big.yml"
    with open(big, "wb") as f:
        f.truncate(1 << 30)  # a sparse gigabyte
    with pytest.raises(WebConfigError, match="larger than 1024 KiB"):
        load_web_config(str(big))


def test_a_tls_file_that_is_a_fifo_is_named_not_waited_on(pki: Path, tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "cert.pem")
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {tmp_path}/cert.pem\n  key_file: {pki}/server.key\n")
    with pytest.raises(WebConfigError, match=r"tls_server_config.cert_file .*cert.pem is a FIFO, not a file"):
        load_web_config(str(web))
