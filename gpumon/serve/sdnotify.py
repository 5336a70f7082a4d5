"""The systemd notify protocol (sd_notify(3)) without libsystemd: one datagram per message to the
socket named by NOTIFY_SOCKET. Does nothing when not run by systemd."""

from __future__ import annotations

import os
import socket


class Notifier:
    def __init__(self, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if env is None else env
        addr = env.get("NOTIFY_SOCKET")
        if addr and addr.startswith("@"):
            addr = "\0" + addr[1:]  # abstract namespace
        self._addr = addr
        usec = env.get("WATCHDOG_USEC")
        pid = env.get("WATCHDOG_PID")
        self.watchdog_s = (
            int(usec) / 1e6 if usec and usec.isdigit() and (not pid or pid == str(os.getpid())) else None
        )
        self._sock: socket.socket | None = None

    @property
    def enabled(self) -> bool:
        return bool(self._addr)

    def send(self, *lines: str) -> None:
        if not self._addr:
            return
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.sendto("\n".join(lines).encode(), self._addr)
        except OSError:
            pass  # systemd gone or socket unreachable: nothing to tell

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}")

    def watchdog(self) -> None:
        if self.watchdog_s is not None:
            self.send("WATCHDOG=1")

    def reloading(self) -> None:
        self.send("RELOADING=1")

    def stopping(self) -> None:
        self.send("STOPPING=1")
