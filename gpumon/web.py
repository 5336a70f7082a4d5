"""The HTTP side of `gpumon serve`: /metrics, /api/v1/state, /healthz and a landing page.

Requests only read the latest snapshot (and a rendering of it cached per snapshot), so scrapes
never call NVML and many clients cost the sampler almost nothing. Connections are bounded in
number and time; requests may not carry a body. TLS and basic auth follow Prometheus's
exporter-toolkit web config file (`tls_server_config`, `basic_auth_users` with bcrypt hashes).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpumon.webconfig import WebConfig, WebConfigError

log = logging.getLogger("gpumon.web")


class Authenticator:
    """Checks basic auth against bcrypt hashes; remembers good credentials (by their SHA-256),
    since bcrypt is slow on purpose and a scraper sends the same ones every few seconds."""

    def __init__(self, users: Mapping[str, bytes]) -> None:
        self._users = users
        self._good: set[bytes] = set()
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return bool(self._users)

    def check(self, header: str | None) -> bool:
        if not self._users:
            return True
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        hashed = self._users.get(user)
        if hashed is None:
            return False
        key = hashlib.sha256(hashed + b"\0" + password.encode()).digest()
        with self._lock:
            if key in self._good:
                return True
        import bcrypt

        if bcrypt.checkpw(password.encode(), hashed):
            with self._lock:
                self._good.add(key)
            return True
        return False


@dataclass
class Routes:
    metrics: Callable[[str], tuple[bytes, str]]
    """Accept header -> (body, content type)."""
    state: Callable[[], dict[str, Any]]
    health: Callable[[], tuple[bool, str]]
    landing: Callable[[], str]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        routes: Routes,
        auth: Authenticator,
        ssl_ctx: ssl.SSLContext | None,
        max_connections: int,
        timeout_s: float,
    ) -> None:
        self.routes = routes
        self.auth = auth
        self.ssl_ctx = ssl_ctx
        self.slots = threading.BoundedSemaphore(max_connections)
        self.timeout_s = timeout_s
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):  # too many clients: refuse at once
            try:
                request.sendall(
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                )
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            request.settimeout(self.timeout_s)  # a slow client holds one slot for at most this long
            if self.ssl_ctx is not None:
                request = self.ssl_ctx.wrap_socket(request, server_side=True)
            super().process_request_thread(request, client_address)
        except (OSError, ssl.SSLError):
            self.shutdown_request(request)
        finally:
            self.slots.release()


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    server_version = "gpumon"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _send(self, code: int, body: bytes, content_type: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        if int(self.headers.get("Content-Length") or 0) > 0:
            self.close_connection = True
            self._send(413, b"requests carry no body\n", "text/plain; charset=utf-8")
            return
        if not self.server.auth.check(self.headers.get("Authorization")):
            self._send(
                401,
                b"unauthorized\n",
                "text/plain; charset=utf-8",
                {"WWW-Authenticate": 'Basic realm="gpumon"'},
            )
            return
        path = self.path.split("?", 1)[0]
        routes = self.server.routes
        if path == "/metrics":
            body, ctype = routes.metrics(self.headers.get("Accept", ""))
            self._send(200, body, ctype)
        elif path == "/api/v1/state":
            self._send(200, json.dumps(routes.state()).encode(), "application/json")
        elif path in ("/healthz", "/-/healthy"):
            ok, why = routes.health()
            self._send(200 if ok else 503, (why + "\n").encode(), "text/plain; charset=utf-8")
        elif path == "/":
            self._send(200, routes.landing().encode(), "text/html; charset=utf-8")
        else:
            self._send(
                404, b"not found: try /metrics, /api/v1/state or /healthz\n", "text/plain; charset=utf-8"
            )

    do_HEAD = do_GET  # noqa: N815 - http.server's names

    def _method_not_allowed(self) -> None:
        self.close_connection = True
        self._send(405, b"only GET\n", "text/plain; charset=utf-8", {"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = _method_not_allowed  # noqa: N815


class WebServer:
    def __init__(
        self,
        address: tuple[str, int],
        routes: Routes,
        web: WebConfig,
        max_connections: int = 64,
        timeout_s: float = 10.0,
    ) -> None:
        ctx = web.ssl_context() if web.tls else None
        try:
            self._server = _Server(address, routes, Authenticator(web.users), ctx, max_connections, timeout_s)
        except OSError as e:
            host, port = address
            raise WebConfigError(f"listen {host or '*'}:{port}: {e.strerror}") from None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, name="gpumon-http", daemon=True
        )
        self._thread.start()

    def reconfigure(self, web: WebConfig) -> None:
        """SIGHUP: new users and certificates apply to new connections."""
        self._server.auth = Authenticator(web.users)
        self._server.ssl_ctx = web.ssl_context() if web.tls else None

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
