"""What gpumon's training-log hooks cost a training step (gpumon.integrations).

    .venv/bin/python -m benchmarks.integration_overhead [--steps 200000] [--repeats 5]

Times the Keras callback's per-step hook (on_train_batch_end) over --steps calls, against three
daemons: one answering, none at all, and one that never answers (its thread stuck in a request
the whole time). The median of --repeats runs is reported in microseconds per step, against a bare
loop. Goal (issue 16): under 50 us a step, whatever the daemon does.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import socket
import statistics
import threading
import time

os.environ.setdefault("KERAS_BACKEND", "torch")


def server(hang: bool) -> tuple[str, threading.Event]:
    release = threading.Event()
    body = json.dumps({"time_unix_s": time.time(), "gpus": []}).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if hang:
                release.wait(600)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    class Quiet(http.server.ThreadingHTTPServer):
        def handle_error(self, request: object, client_address: object) -> None:
            pass  # the hung client goes away at the end: no story to tell

    s = Quiet(("127.0.0.1", 0), Handler)
    threading.Thread(target=s.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{s.server_address[1]}", release


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    from gpumon.integrations.keras import GpumonCallback

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    answering, _ = server(hang=False)
    hung, release = server(hang=True)

    def bare() -> float:
        start = time.perf_counter()
        for _ in range(args.steps):
            pass
        return (time.perf_counter() - start) / args.steps

    def per_step(url: str) -> float:
        cb = GpumonCallback(url, every_s=0.05, log=lambda line: None)
        cb.on_train_begin()
        time.sleep(0.2)  # the thread is asking (or stuck asking) by now
        hook = cb.on_train_batch_end
        start = time.perf_counter()
        for n in range(args.steps):
            hook(n)
        took = (time.perf_counter() - start) / args.steps
        cb.watch.stop(summary=False)
        return took

    print(f"{'daemon':24} {'us/step (median of ' + str(args.repeats) + ')':>26}")
    print(f"{'(bare loop)':24} {statistics.median(bare() for _ in range(args.repeats)) * 1e6:26.3f}")
    for name, url in (("answering", answering), ("none", dead), ("hung (never answers)", hung)):
        took = statistics.median(per_step(url) for _ in range(args.repeats))
        print(f"{name:24} {took * 1e6:26.3f}")
    release.set()


if __name__ == "__main__":
    main()
