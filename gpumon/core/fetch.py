"""One HTTP GET with a total deadline and a bounded body, for the commands that ask a daemon or a
Prometheus (`gpumon report`, which the Slurm epilog runs: it must end).

A timeout on a socket is per read: a server that trickles a byte a second never trips it. Here a
timer shuts the socket down at the deadline, whatever is being read; http.client parses the
answer (header lines and count bounded by it), the body is read to `max_bytes` at most. Credentials
in the URL (`http://user:pass@host/`) become an Authorization header and never appear in an error.
The training-log hooks keep their own copy of this (gpumon.integrations imports nothing of gpumon).
"""

from __future__ import annotations

import base64
import http.client
import socket
import threading
import urllib.parse


class FetchError(Exception):
    """The URL could not be read; `str()` names it without its credentials."""


def redacted(url: str) -> str:
    """The URL as it may be shown: without a password."""
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.password is None and parts.username is None:
            return url
        port = parts.port  # ValueError: not a number, or out of range
    except ValueError:  # not a URL (`http://[::1`): whatever stands before an @ may be a password
        return url.split("//", 1)[0] + "//***@" + url.rsplit("@", 1)[1] if "@" in url else url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{parts.username}:***@{host}" if parts.username else host
    if port is not None:
        netloc += f":{port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def basic_header(credentials: str) -> dict[str, str]:
    """USER:PASSWORD -> the Authorization header. Bytes that are not UTF-8 (an environment
    variable's, which Python holds as lone surrogates) are sent as they were given."""
    try:
        raw = credentials.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # (a surrogate no bytes stand behind: never from the environment)
        raw = credentials.encode("utf-8", "replace")
    return {"Authorization": "Basic " + base64.b64encode(raw).decode()}


def get(
    url: str, deadline_s: float, max_bytes: int, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    """(status, body) of a GET, within `deadline_s` in all and `max_bytes` of body; FetchError
    (naming the redacted URL) otherwise."""
    shown = redacted(url)
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise FetchError(f"{shown}: not a URL ({e})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchError(f"{shown}: not an http:// or https:// URL")
    sent = dict(headers or {})
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        sent.setdefault("Authorization", basic_header(f"{user}:{password}")["Authorization"])
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = kind(parts.hostname, port, timeout=deadline_s)
    expired = threading.Event()
    connected: list[socket.socket] = []
    """The socket, kept from the connect: an answer that ends with its connection (no length) takes
    it from `conn` (http.client leaves conn.sock None), and the cut must still reach it."""

    def cut() -> None:
        expired.set()
        for sock in [*connected, conn.sock]:
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    timer = threading.Timer(deadline_s, cut)
    timer.daemon = True
    timer.start()
    try:
        conn.connect()
        if conn.sock is not None:
            connected.append(conn.sock)
        if expired.is_set():
            raise TimeoutError()
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn.request("GET", path, headers=sent)
        response = conn.getresponse()
        body = response.read(max_bytes + 1)
        if expired.is_set():
            raise TimeoutError()
    except (OSError, http.client.HTTPException) as e:
        if expired.is_set() or isinstance(e, TimeoutError):
            raise FetchError(f"{shown}: no whole answer within {deadline_s:g} s") from None
        why = getattr(e, "strerror", None) or str(e) or type(e).__name__
        raise FetchError(f"{shown}: cannot read: {why}") from None
    finally:
        timer.cancel()
        conn.close()
    if len(body) > max_bytes:
        raise FetchError(f"{shown}: an answer longer than {max_bytes} bytes: not read")
    return response.status, body
