"""gpumon's verdict in the training log: for the job, not the daemon (which never imports this).

Standard library only, so importing it costs a training process nothing new. A background thread
asks the local daemon's state API (`$GPUMON_URL`, default http://127.0.0.1:9877, as the dstat
plugin) every few seconds, with a short timeout, which GPUs this process and its children hold; a
training step never waits for it (a step's cost is reading one attribute). Once per starvation
episode of those GPUs it says so, with the cause and what to change; at the end, a summary: time
in each state and GPU-hours wasted during the run. No daemon: one line at the start, then silence.

The contract with the training code, whatever the daemon does (hangs, trickles a byte a second,
sends an endless body, a JSON list, JSON nested a million deep, new GPUs at every question) and
whatever the environment holds: no exception reaches it (a setting it cannot use is one line, and
the default or no watching), nothing it calls waits longer than a total deadline (`stop()`:
STOP_DEADLINE_S, the end of a run included; each question to the daemon: `timeout_s` in all, not
per read), and what is kept and said is bounded (a state of at most MAX_STATE_BYTES, at most
MAX_PENDING lines of MAX_LINE_CHARS waiting, MAX_GPUS GPUs followed, a summary of at most
MAX_SUMMARY_GPUS lines and one for the rest).

    from gpumon.integrations import Watch          # any loop
    with Watch(framework="torch"):
        train()

    from gpumon.integrations.keras import GpumonCallback       # model.fit(..., callbacks=[...])
    from gpumon.integrations.lightning import GpumonCallback   # Trainer(callbacks=[...])
"""

from __future__ import annotations

import base64
import http.client
import itertools
import json
import math
import operator
import os
import re
import socket
import sys
import threading
import time
import urllib.parse
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import Any

DEFAULT_URL = "http://127.0.0.1:9877"
EVERY_S = 5.0
TIMEOUT_S = 1.0
SETTLE_S = 15.0
"""An episode already going on when the run started is the GPU's previous job's until the detector
has had this long to judge the new one (its window and confirmation)."""
FIND_S = 60.0
"""How long a job may take to put its first kernel on a GPU before the watch says it found none."""
QUIET_RETRY_S = 30.0
"""With no daemon, it is asked again this seldom, silently (it may start later)."""
REPORTED = ("starved", "stalled", "sync-stall")
MAX_STATE_BYTES = 8 * 1024 * 1024
"""A daemon's state is tens of KB per GPU at most: a longer answer is not read."""
STOP_DEADLINE_S = 3.0
"""The most `stop()` (the end of training) waits, with the final question to the daemon."""
MAX_PENDING = 100
MAX_GPUS = 64
"""GPUs followed: of a state's GPUs, the first this many; of the GPUs seen in the run, the summary's
readings of the last this many seen (a daemon that names new GPUs at every question replaces the
oldest rather than growing the watch)."""
MAX_SUMMARY_GPUS = 16
"""The summary's lines, one per GPU: beyond this many GPUs, the ones that wasted most, and the
rest in one line."""
MAX_NAME_CHARS = 100
"""A GPU's UUID is some 40 characters (a MIG instance's a few more): a daemon's longer one names
no GPU (it would be kept with each episode said)."""
MAX_READING_BYTES = 4096
"""A GPU's counters as the summary keeps them (seconds in each state and by cause, GPU-seconds
wasted) are a few hundred bytes; longer ones are not gpumon's, and that GPU gets no summary."""
MAX_LINE_CHARS = 1000
"""A line longer than this (a daemon's label or advice, a URL) is cut: the log is the user's."""
MIN_S = 0.05
"""`every_s` and `timeout_s` from this (NaN or 0 would ask the daemon as fast as it answers) to
MAX_EVERY_S and MAX_TIMEOUT_S (1e300 s is more than a thread can wait)."""
MAX_EVERY_S = 3600.0
MAX_TIMEOUT_S = 60.0
MAX_REPORTED = 1000
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""C0 and C1 controls and DEL (gpumon.core.terminal's, newline included: a line is one line). A
daemon's label, advice or HTTP reason with an escape sequence would otherwise reach the terminal
that shows the training log."""

ADVICE = {
    ("cpu", "keras"): "raise PyDataset(workers=N, use_multiprocessing=True) or cache decoded samples",
    ("cpu", "torch"): "raise DataLoader(num_workers) or cache decoded samples",
    ("cpu", None): "preprocess in more worker processes, or cache decoded samples",
    (
        "io",
        None,
    ): "copy the data to local SSD or page cache, or read fewer, larger files with more I/O threads",
    ("host", None): "look at network or remote data, and host-side work between steps (.item(), logging)",
    ("stalled", None): "the GPU holds memory but runs nothing: a hang? (py-spy dump --pid PID)",
    ("sync-stall", None): "ranks wait in collectives for a straggler: balance the input across ranks",
}


KNOBS = {"torch": "DataLoader(num_workers)", "keras": "PyDataset(workers)"}
"""The setting a change of loader workers is, per framework (the daemon's advice says "loader
workers")."""
FRAMEWORKS = tuple(KNOBS)
"""The `framework=` values with advice of their own; any other is the general advice."""


def fix_line(advice: Any, framework: str | None) -> str | None:
    """What a fix buys, from the state API's `advice` (docs/detector.md), in the framework's words;
    None while the daemon is still gathering the episode's windows, or where the GPU is the limit
    (a GPU healthy only by the hysteresis may have a line; Watch asks only of starved GPUs)."""
    if not isinstance(advice, dict) or not advice.get("ready") or advice.get("kind") == "gpu-limit":
        return None
    line = advice.get("line")
    if not isinstance(line, str) or not line:
        return None
    knob = KNOBS.get(framework, "loader workers") if isinstance(framework, str) else "loader workers"
    return line.replace("loader workers", knob)


def advice(label: str, framework: str | None) -> str:
    cause = label.split("-", 1)[1] if label.startswith("starved-") else label
    if not isinstance(framework, str):  # (a list would make the key unhashable: no line at all)
        framework = None
    return ADVICE.get((cause, framework)) or ADVICE.get((cause, None)) or ""


def _print(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def process_tree(root: int, proc: str = "/proc") -> set[int]:
    """`root` and its descendants, from /proc (no psutil needed in the job)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir(proc)
    except OSError:
        return {root}
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses; ppid follows the last ')'
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(int(name))
    tree, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in tree:
                tree.add(child)
                todo.append(child)
    return tree


class Watch:
    """Watches the GPUs this process uses, from a background thread; see the module's doc.

    `gpus`: GPU indices to watch instead of finding them by process (a container whose PID
    namespace hides its processes' host PIDs from the daemon). `log`: where lines go (stderr)."""

    def __init__(
        self,
        url: str | None = None,
        *,
        framework: str | None = None,
        gpus: Iterable[int | str] | str | None = None,
        every_s: float = EVERY_S,
        timeout_s: float = TIMEOUT_S,
        log: Callable[[str], None] | None = None,
        pid: int | None = None,
        defer: bool = False,
    ) -> None:
        """`gpus`: indices (0, "0"), UUIDs ("GPU-..." or "MIG-...", as CUDA_VISIBLE_DEVICES may
        hold them), or a comma-separated string of either. `defer`: hold lines until `drain()` (a
        callback prints them between steps, so they do not cut through a progress bar). Never
        raises: what cannot be used (an interval that is not a number of seconds, credentials no
        header can carry) is one line, and the defaults or no watching."""
        self.log = log or _print
        self.defer = defer
        self.pending: deque[str] = deque(maxlen=MAX_PENDING)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._generation = 0
        """Which run this is (`_new_run` counts them): a question asked for an earlier run (a slow
        one, still out when that run stopped) has its answer dropped, not read into this one."""
        self._lock = threading.Lock()
        """Held while a run's readings change: by `_new_run`, and by a poll reading its answer
        (never while it asks the daemon or says a line)."""
        self._reported: OrderedDict[tuple[str, float], None] = OrderedDict()
        self._advised: OrderedDict[tuple[str, float], None] = OrderedDict()
        """Episodes whose fix line (what a fix buys) has been said."""
        self._first: dict[str, dict[str, Any] | None] = {}
        """Each GPU's first reading that judges this run (the summary counts from it); None where
        its counters are not gpumon's (`_reading`)."""
        self._judged_from: dict[str, float] = {}
        """Seconds into the run of that reading."""
        self._last: OrderedDict[str, dict[str, Any] | None] = OrderedDict()
        """Each GPU's last reading, the GPU seen longest ago first: at most MAX_GPUS, and a GPU
        forgotten here is forgotten in `_first` and `_judged_from` too."""
        self._reachable: bool | None = None
        self._said_which = False
        self._started_at = time.monotonic()
        self._started_unix = time.time()
        self._found_at: float | None = None
        problems: list[str] = []
        self.framework = _framework(framework, problems)
        self.every_s = _seconds(every_s, "every_s", EVERY_S, MAX_EVERY_S, problems)
        self.timeout_s = _seconds(timeout_s, "timeout_s", TIMEOUT_S, MAX_TIMEOUT_S, problems)
        self.url, self.gpus, self.pid, self._auth = DEFAULT_URL, None, os.getpid(), {}
        self._off = False
        """Nothing to watch with (a bad argument or environment): no thread, no lines but the one."""
        try:
            self.url = (url or os.environ.get("GPUMON_URL") or DEFAULT_URL).rstrip("/")
            self.gpus = _gpu_set(gpus, problems) if gpus is not None else None
            self.pid = pid or os.getpid()
            self._auth = _auth_header(self.url)
        except Exception as e:  # an exception here would be raised in the user's code: unwatched
            self._off = True
            problems.append(f"cannot watch ({e or type(e).__name__})")
        if problems:
            off = ": no GPU starvation reports for this run" if self._off else ""
            self._say("gpumon: " + "; ".join(problems) + off)

    # -- the training side -------------------------------------------------------------------------

    def start(self) -> Watch:
        """Start watching; a watch stopped before starts a new run (Keras calls `fit` again with
        the same callback): its own thread, episodes and summary."""
        try:
            if self._thread is None and not self._off:
                if self._stop.is_set():
                    self._new_run()
                self._thread = threading.Thread(
                    target=self._run, args=(self._stop, self._generation), name="gpumon-watch", daemon=True
                )
                self._thread.start()
        except Exception:  # (no thread to be had): the training runs on, unwatched
            pass
        return self

    def drain(self) -> None:
        """Print what the thread found (the callbacks call this between steps: it costs a check)."""
        try:
            while self.pending:
                self.log(self.pending.popleft())
        except Exception:  # a log function that fails is not the training's problem
            pass

    def stop(self, summary: bool = True) -> None:
        """Stop watching; ask once more and print the run's summary: within STOP_DEADLINE_S in
        all, whatever the daemon does (the asking happens in a thread this one stops waiting for)."""
        try:
            deadline = time.monotonic() + STOP_DEADLINE_S
            self._stop.set()
            if self._thread is not None:
                self._thread.join(max(0.0, deadline - time.monotonic()))
                self._thread = None
            if summary and self._reachable:
                last = threading.Thread(
                    target=self._final, args=(self._generation,), name="gpumon-watch-end", daemon=True
                )
                last.start()
                last.join(max(0.0, deadline - time.monotonic()))
            self.drain()
        except Exception:
            pass

    def _new_run(self) -> None:
        """Forget the last run (a thread of it still asking the daemon stops at its own event, and
        what it is still asking is dropped when the answer comes: it is the last run's)."""
        with self._lock:
            self._generation += 1
            self._stop = threading.Event()
            self._reported, self._advised = OrderedDict(), OrderedDict()
            self._first, self._judged_from, self._last = {}, {}, OrderedDict()
            self._said_which, self._found_at = False, None
            self._started_at, self._started_unix = time.monotonic(), time.time()

    def _final(self, generation: int) -> None:
        try:
            self._poll(generation)
        except Exception:  # as in the background thread: the training goes on, the summary follows
            pass
        try:
            with self._lock:
                if generation != self._generation:
                    return  # (the next run began while this asked: the summary is the old run's)
                lines = self._summary()
        except Exception:  # a daemon of another version: no summary rather than a wrong one
            return
        for line in lines:
            self._say(line)

    def __enter__(self) -> Watch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the background thread ---------------------------------------------------------------------

    def _run(self, stop: threading.Event, generation: int) -> None:
        while not stop.is_set():
            try:
                self._poll(generation)
            except Exception:  # whatever goes wrong, the watch goes quiet: the training goes on
                pass
            stop.wait(self.every_s if self._reachable else QUIET_RETRY_S)

    def _say(self, line: str) -> None:
        if len(line) > MAX_LINE_CHARS:
            line = line[: MAX_LINE_CHARS - 3] + "..."
        # text any log can write: a URL's byte \xff is Python's lone '\udcff', as a daemon's JSON
        # may send one, which a UTF-8 log file refuses (logging prints a traceback for it)
        line = line.encode("utf-8", "backslashreplace").decode("utf-8")
        line = _CONTROL.sub("?", line)
        if self.defer:
            self.pending.append(line)
            return
        try:
            self.log(line)
        except Exception:  # the user's log function failing is not the watch's to raise
            pass

    def _poll(self, generation: int | None = None) -> None:
        """Ask the daemon once, for run `generation` (the current one when None)."""
        run = self._generation if generation is None else generation
        try:
            body = get(self.url + "/api/v1/state", self._auth, self.timeout_s, MAX_STATE_BYTES)
            state = json.loads(body)
        except Exception as e:  # unreachable, slow, too large, not JSON, nested too deep
            if run != self._generation:
                return  # asked for a run that has ended: the new run's own questions say what they find
            if self._reachable is None:  # said once; later failures (a daemon restarting) stay quiet
                why = getattr(e, "reason", None) or str(e) or type(e).__name__
                shown = _without_password(self.url)
                why = str(why).replace(self.url, shown)  # (an error that names the URL names it so)
                self._say(f"gpumon: no daemon at {shown} ({why}): no GPU starvation reports for this run")
                self._reachable = False
            return
        if run != self._generation:
            return  # an answer for a run that has ended (stop, then start): not this run's reading
        self._reachable = True
        if not isinstance(state, dict):
            return  # not a gpumon state: say nothing rather than something wrong
        tree = process_tree(self.pid) if self.gpus is None else set()
        said: list[str] = []
        try:
            with self._lock:  # (checked again: the next run may have begun since)
                if run == self._generation:
                    self._look(state, tree, said)
        except Exception:
            pass  # a daemon of another version: say nothing rather than something wrong
        for line in said:
            self._say(line)

    def _mine(self, state: dict[str, Any], tree: set[int], said: list[str]) -> list[dict[str, Any]]:
        listed = state.get("gpus")
        gpus = [g for g in listed[:MAX_GPUS] if _named(g)] if isinstance(listed, list) else []
        if self.gpus is not None:
            named = [g for g in gpus if g.get("index") in self.gpus or g.get("uuid") in self.gpus]
            if not named and gpus and not self._said_which and time.monotonic() - self._started_at > FIND_S:
                self._said_which = True  # (said nothing: a container's own numbering, a CUDA order)
                said.append(
                    f"gpumon: after {FIND_S:.0f} s, no GPU named by gpus= is among the daemon's "
                    "(name them by UUID, or by the host's nvidia-smi index)"
                )
            return named
        mine = [g for g in gpus if tree & set(g.get("pids") or ())]
        if mine:
            self._found_at = self._found_at or time.monotonic()
        elif (
            not self._said_which
            and time.monotonic() - self._started_at > FIND_S
            and any(g.get("pids") for g in gpus)
        ):
            self._said_which = True  # the GPUs' processes are someone else's, or hidden by a namespace
            said.append(
                f"gpumon: after {FIND_S:.0f} s, none of this job's processes is on a GPU the daemon sees "
                "(in a container? pass gpus=[...] to the callback)"
            )
        return mine

    def _look(self, state: dict[str, Any], tree: set[int], said: list[str]) -> None:
        """Read one answer into the run's readings; the lines it has to say go to `said`."""
        now = float(state.get("time_unix_s") or time.time())
        if not math.isfinite(now):  # (JSON from Python may say NaN or Infinity)
            now = time.time()
        for g in self._mine(state, tree, said):
            key = g.get("uuid") or str(g["index"])
            current = next(
                (e for e in reversed(g.get("episodes") or []) if e.get("end_unix_s") is None), None
            )
            start = float(current["start_unix_s"]) if current else now - float(g.get("since_s") or 0)
            if not math.isfinite(start):
                continue  # no episode this can be (NaN is no episode twice: it was said at every question)
            ours = start >= self._started_unix - 2 or now - self._started_unix >= SETTLE_S
            reading = _reading(g)
            if key not in self._first and ours:
                # the run's counters start once the daemon judges this run, not the GPU's previous
                # state carried into its first seconds (a fed job's summary read "idle 10 s (59%)")
                self._first[key] = reading
                self._judged_from[key] = now - self._started_unix
            self._last[key] = reading
            self._last.move_to_end(key)
            while len(self._last) > MAX_GPUS:  # a daemon naming new GPUs at every question
                gone, _ = self._last.popitem(last=False)
                self._first.pop(gone, None)
                self._judged_from.pop(gone, None)
            label = str(g.get("label") or "")
            if not label.startswith(REPORTED):
                continue
            episode = (key, round(start, 1))
            fix = fix_line(g.get("advice"), self.framework) if label.startswith("starved") else None
            if episode in self._reported:
                if fix is not None and episode not in self._advised:  # the prediction came later
                    _remember(self._advised, episode)
                    said.append(f"gpumon: GPU {g['index']}: what a fix buys: {fix}")
                continue
            if not ours:
                continue  # an episode of the GPU's previous job, until the detector has seen ours
            _remember(self._reported, episode)
            line = self._episode_line(g, label, now - max(start, self._started_unix))
            if fix is not None:
                _remember(self._advised, episode)
                line += f"; what a fix buys: {fix}"
            said.append(line)

    def _episode_line(self, g: dict[str, Any], label: str, for_s: float) -> str:
        ev = g.get("evidence") or {}
        duty = ev.get("duty_cycle")
        idle = (
            f", {1 - duty:.0%} idle" if isinstance(duty, (int, float)) and label.startswith("starved") else ""
        )
        what = label.replace("starved-", "starved (") + ")" if label.startswith("starved-") else label
        tip = advice(label, self.framework)
        return f"gpumon: GPU {g['index']} {what} for {for_s:.0f} s{idle}" + (f": {tip}" if tip else "")

    def _say_summary(self) -> None:
        for line in self._summary():
            self._say(line)

    def _summary(self) -> list[str]:
        """The run's summary lines."""
        lines: list[tuple[float, int, str]] = []  # GPU-seconds wasted, index, line
        for key, last in list(self._last.items()):
            first = self._first.get(key, last)  # never judged: nothing counted (too short)
            if first is None or last is None:
                continue  # counters no gpumon sends: no line rather than a wrong one
            spent = _deltas(first.get("seconds_in_state"), last.get("seconds_in_state"))
            causes = _deltas(first.get("starved_seconds_by_cause"), last.get("starved_seconds_by_cause"))
            if "starved" in spent and causes:  # starved-cpu 40 s, starved-io 5 s, rather than starved 45 s
                del spent["starved"]
                spent.update({f"starved-{k}": v for k, v in causes.items()})
            total = sum(spent.values()) or 1.0
            wasted = float(last.get("wasted_gpu_s") or 0.0) - float(first.get("wasted_gpu_s") or 0.0)
            states = ", ".join(
                f"{k} {v:.0f} s ({v / total:.0%})" for k, v in sorted(spent.items(), key=lambda kv: -kv[1])
            )
            settling = self._judged_from.get(key, 0.0)
            since = f" (judged from {settling:.0f} s in)" if settling >= 1 else ""
            line = (
                f"gpumon: this run on GPU {last['index']}: {states or 'too short to judge'}; "
                f"{wasted / 3600:.4f} GPU-hours wasted{since}"
            )
            lines.append((wasted, last["index"], line))
        # by GPU; beyond MAX_SUMMARY_GPUS (a daemon that named GPUs by the thousand), the worst
        worst = sorted(lines, key=lambda w: -w[0])[:MAX_SUMMARY_GPUS]
        out = [line for _, _, line in sorted(worst, key=lambda w: w[1])]
        more = len(lines) - len(worst)
        if more:
            rest = sum(w[0] for w in lines) - sum(w[0] for w in worst)
            gpus = "GPUs" if more > 1 else "GPU"
            out.append(f"gpumon: this run on {more} more {gpus}: {rest / 3600:.4f} GPU-hours wasted")
        return out


def _deltas(before: Any, after: Any) -> dict[str, float]:
    """Seconds per key spent between two readings of a daemon's counters (half a second or more)."""
    before, after = before or {}, after or {}
    out = {k: float(v) - float(before.get(k, 0.0)) for k, v in after.items()}
    return {k: v for k, v in out.items() if v >= 0.5}


def get(url: str, headers: dict[str, str], deadline_s: float, max_bytes: int) -> bytes:
    """The body of a GET answered 200, within `deadline_s` in all (a daemon that trickles a byte a
    second is cut off: a per-read timeout would wait forever) and at most `max_bytes`; an
    exception otherwise. Standard library only: http.client reads the answer (its header lines
    and count bounded), a timer shuts the socket at the deadline."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http:// or https:// URL with a host")  # (never the URL: a password)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = kind(parts.hostname, parts.port, timeout=deadline_s)
    expired = threading.Event()
    connected: list[socket.socket] = []
    """The socket from the connect: an answer that ends with its connection takes it from `conn`
    (http.client leaves conn.sock None), and the cut must still reach it."""

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
            raise TimeoutError(f"no answer within {deadline_s:g} s")
        conn.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), headers=headers)
        response = conn.getresponse()
        if response.status != 200:
            raise OSError(f"HTTP {response.status} {response.reason}")
        body = response.read(max_bytes + 1)
        if expired.is_set():
            raise TimeoutError(f"no whole answer within {deadline_s:g} s")
        if len(body) > max_bytes:
            raise ValueError(f"an answer longer than {max_bytes} bytes")
        return body
    except (OSError, http.client.HTTPException) as e:
        if expired.is_set():
            raise TimeoutError(f"no whole answer within {deadline_s:g} s") from None
        raise e
    finally:
        timer.cancel()
        conn.close()


def _without_password(url: str) -> str:
    """The URL as the training log may show it: what stands before an @ (USER:PASSWORD) hidden."""
    scheme, sep, rest = url.partition("//")
    authority, slash, path = rest.partition("/")
    if not sep or "@" not in authority:
        return url
    return f"{scheme}//***@{authority.rpartition('@')[2]}{slash}{path}"  # (the last @, as urlsplit)


def _auth_header(url: str = "") -> dict[str, str]:
    """GPUMON_BASIC_AUTH=USER:PASSWORD, when the daemon asks for basic auth: the variable's bytes
    as the environment holds them (the daemon checks a password's bytes, UTF-8 or not: `user:\\xff`
    is Python's 'user:\\udcff', which UTF-8 cannot encode). Without it, the URL's USER:PASSWORD@,
    as `gpumon report` and `dstat --gpu` send it (they were ignored: the daemon said 401)."""
    creds = os.environ.get("GPUMON_BASIC_AUTH")
    name = "GPUMON_BASIC_AUTH"
    if not creds:
        _, sep, rest = url.partition("//")
        authority = rest.partition("/")[0]
        if not sep or "@" not in authority:
            return {}
        user, _, password = authority.rpartition("@")[0].partition(":")
        creds = urllib.parse.unquote(user) + ":" + urllib.parse.unquote(password)
        name = "the URL's credentials"
    try:
        raw = os.fsencode(creds)
    except UnicodeError:  # set from Python, not by the environment; the message never shows it
        raise ValueError(f"{name}: characters that are not bytes") from None
    return {"Authorization": "Basic " + base64.b64encode(raw).decode()}


def _gpu_set(gpus: Any, problems: list[str]) -> set[int | str]:
    """The GPUs a caller named: indices and UUIDs, at most MAX_GPUS of them (an endless iterator
    would hold the training code for good). `gpus=["0", "1"]` (CUDA_VISIBLE_DEVICES split) watched
    nothing: no index of a daemon's is a string. What is neither is one line and left out; with
    nothing left, ValueError."""
    if isinstance(gpus, (bytes, bytearray)):  # (iterated, b"0,1" was the indices 48, 44 and 49)
        gpus = bytes(gpus).decode("latin-1")
    if isinstance(gpus, str):
        gpus = gpus.split(",")
    given = list(itertools.islice(iter(gpus), MAX_GPUS + 1))
    if len(given) > MAX_GPUS:
        given = given[:MAX_GPUS]
        problems.append(f"gpus: more than {MAX_GPUS} given: the first {MAX_GPUS} watched")
    found: set[int | str] = set()
    bad: list[str] = []
    for item in given:
        if isinstance(item, str):
            text = item.strip()
            if text.isascii() and text.isdigit() and len(text) <= 6:
                found.add(int(text))
            elif 0 < len(text) <= MAX_NAME_CHARS and text.isprintable():
                found.add(text)  # a UUID
            else:
                bad.append(repr(text[:20]))
            continue
        try:
            index = -1 if isinstance(item, bool) else operator.index(item)  # numpy's and torch's ints too
        except Exception:
            index = int(item) if isinstance(item, float) and item.is_integer() and item >= 0 else -1
        if index >= 0:
            found.add(index)
        else:
            try:
                bad.append(repr(item)[:20])
            except Exception:  # (an object whose repr raises: named by its type)
                bad.append(type(item).__name__[:20])
    if bad:
        problems.append(f"gpus: not a GPU index or UUID: {', '.join(bad[:3])}")
    if not found:
        raise ValueError("gpus names no GPU")
    return found


def _framework(value: Any, problems: list[str]) -> str | None:
    """`framework=` as the advice reads it: one of FRAMEWORKS, or None (the general advice). A
    value that is none of them (a list, a dict: each line's lookup raised, and the hook said
    nothing at all) is the general advice, and why in `problems`."""
    if value is None:
        return None
    text = str.__str__(value) if isinstance(value, str) else None  # (a subclass's own methods unused)
    if text in FRAMEWORKS:
        return text
    given = f"={text[:20]!r}" if text is not None else f"=<{type(value).__name__[:40]}>"
    problems.append(f"framework{given} is not one of {', '.join(FRAMEWORKS)}: the general advice instead")
    return None


def _seconds(value: float, name: str, default: float, most: float, problems: list[str]) -> float:
    """`value` in seconds, from MIN_S to `most`; else `default`, and why in `problems`."""
    try:
        s = float(value)
    except Exception:  # whatever a caller passed, its __float__ raising included
        problems.append(f"{name} is not a number: {default:g} s instead")
        return default
    if MIN_S <= s <= most:  # NaN is not
        return s
    problems.append(f"{name}={s:g} is not {MIN_S:g} to {most:g} s: {default:g} s instead")
    return default


def _named(g: Any) -> bool:
    """A GPU as a gpumon daemon names it: an index, and a UUID of at most MAX_NAME_CHARS or none."""
    if not isinstance(g, dict) or not isinstance(g.get("index"), int):
        return False
    uuid = g.get("uuid")
    return uuid is None or (isinstance(uuid, str) and len(uuid) <= MAX_NAME_CHARS)


def _reading(g: dict[str, Any]) -> dict[str, Any] | None:
    """What the summary needs of a GPU's reading: its index and counters, not its episodes,
    evidence or advice (a daemon could make those megabytes, and a reading from the run's start is
    kept per GPU); None when even those are longer than MAX_READING_BYTES."""
    reading = {k: g.get(k) for k in ("index", "seconds_in_state", "starved_seconds_by_cause", "wasted_gpu_s")}
    try:
        size = len(json.dumps(reading))
    except (ValueError, RecursionError):
        return None
    return reading if size <= MAX_READING_BYTES else None


def _remember(seen: OrderedDict[tuple[str, float], None], episode: tuple[str, float]) -> None:
    """Mark an episode as said, forgetting the oldest beyond MAX_REPORTED (a job that runs for
    weeks must not grow the set)."""
    seen[episode] = None
    while len(seen) > MAX_REPORTED:
        seen.popitem(last=False)


def watch(**kw: Any) -> Watch:
    """A started Watch (stop it, or use `with Watch(...)`, to get the summary)."""
    return Watch(**kw).start()


__all__ = ["Watch", "advice", "fix_line", "get", "process_tree", "watch"]
