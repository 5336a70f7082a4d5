"""The daemon's flight recorder: every tick the detector sees, kept on disk in trace format 2.

Segments: one trace file per `segment_s` of the samples' wall-clock time, aligned to it (hourly by
default: `gpumon-20261130T140000Z.jsonl.gz` holds 14:00 to 15:00 UTC), each a standalone trace that
`gpumon analyze FILE` reads, all of them what `gpumon analyze --from DIR` reads. A segment also
ends early at a tenth of `max_bytes`, so retention never has to delete the one being written.

Retention, after each rotation and once a minute: the oldest segments go while all their samples
are older than `max_age_s`, or while the segments together exceed `max_bytes`. Only files named as
segments are ever deleted.

Writing happens in the recorder's own thread, from a bounded queue: a slow or hung disk never holds
up the sampler (a tick that finds the queue full is dropped, and counted). A write that fails (disk
full, directory unwritable) pauses recording: logged once, counted, the broken segment closed (it
reads up to its last whole record); every RETRY_S a new segment is tried, and recording resumes
(logged) when it opens and takes a tick. After each write the open segment is checked to be still
the file its path names (an fstat and a stat): a segment or directory removed or moved while being
written pauses recording the same way, rather than filling a file nobody can read. A directory
that was removed is not made again (it may have been a mount, or removed on purpose): recording
resumes when it is back. A bug in the recorder pauses it too (logged once with its traceback),
and it tries again every RETRY_S: it never stops for good while the daemon runs.
"""

from __future__ import annotations

import fcntl
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from gpumon.core.errors import OutputError
from gpumon.core.model import Tick
from gpumon.core.threads import named_thread
from gpumon.trace.segments import list_segments, segment_name

if TYPE_CHECKING:
    from gpumon.trace.writer import TraceWriterV2

log = logging.getLogger("gpumon")

RETRY_S = 30.0
RETENTION_EVERY_S = 60.0
QUEUE_TICKS = 600
SYNC_EVERY_S = 5.0
"""The ticks are handed to the OS (decodable) every 5 s, not after each one: a deflate block per tick
made a GPU-day 30% larger (docs/recorder.md). So a kill -9 loses at most the last 5 s of ticks;
fsync follows every 5 s (a power cut: 10 s). In real time the recorder's thread also wakes only
that often, and writes the ticks queued since in one go: woken for every tick, the recorder took
a fifth of an idle daemon's CPU, 0.051-0.068% of a core against 0.040% now (docs/recorder.md)."""
LOCK_NAME = ".gpumon-recorder.lock"
"""In the recording directory: who records into it (one daemon at a time). Not a segment's name:
never read as one, never deleted by retention."""
HOLD_MAX_S = 2.0
"""The longest a `held` recorder's thread waits for `release` (the daemon's first sample published)
before it takes its first tick: see Recorder."""
_SYNC = object()
"""Put in the queue by `flush`: the ticks before it go to the OS now."""


class RecorderStats(NamedTuple):
    """What `gpumon_recorder_*` and the state API say about the recorder."""

    directory: str
    up: bool
    bytes_written: int = 0
    segments: int = 0
    disk_bytes: int = 0
    oldest_unix_s: float | None = None
    newest_unix_s: float | None = None
    errors: int = 0
    dropped_ticks: int = 0
    paused_reason: str | None = None


class Recorder:
    def __init__(
        self,
        directory: str,
        source: dict[str, Any],
        interval_s: float,
        unix_offset: Callable[[], float],
        *,
        segment_s: float = 3600.0,
        max_age_s: float = 7 * 86400.0,
        max_bytes: int = 2_000_000_000,
        block: bool = False,
        queue_ticks: int = QUEUE_TICKS,
        open_writer: Callable[[str, dict[str, Any], float], TraceWriterV2] | None = None,
        held: bool = False,
    ) -> None:
        """`unix_offset()`: add to a tick's t_s for Unix time. `block`: wait for room in the queue
        instead of dropping a tick (a simulation at full speed, where nothing is real-time).
        `held`: the thread takes its first tick once `release` is called (or `close`, or after
        HOLD_MAX_S): the daemon's first sample is published first, the writer and its encoders
        (json, gzip) imported after it, and the first segment's opening never competes with it
        for the interpreter. Ticks wait in the queue meanwhile: none is lost."""
        self.directory = directory
        self._source = source
        self._interval_s = interval_s
        self._unix_offset = unix_offset
        self.segment_s = segment_s
        self.max_age_s = max_age_s
        self.max_bytes = max_bytes
        self._block = block
        self._open_writer = open_writer or _open_segment_file
        self._released = threading.Event()
        if not held:
            self._released.set()
        self._queue: queue.Queue[Tick | object | None] = queue.Queue(maxsize=queue_ticks)
        self._wake = threading.Event()
        """Set when the thread must not wait for its SYNC_EVERY_S: a flush, a close, a queue half
        full, or every tick when `block` (a simulation at full speed)."""
        self._wake_at = max(1, queue_ticks // 2)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stats = RecorderStats(directory, up=True)
        self._writer: TraceWriterV2 | None = None
        self._bucket: int | None = None
        self._seg_start_unix = 0.0
        self._written_before = 0
        self._paused_since: float | None = None
        self._retry_at = 0.0
        self._not_recorded = 0
        self._last_retention: float | None = None
        self._closed_bytes = 0
        """Bytes of the segments this recorder wrote and closed."""
        self._newest_unix = 0.0
        self._made_directory = False
        """The directory was there (or made) once: if it goes, it is waited for, not made again."""
        self._lock_fd: int | None = None
        """The directory's lock, held while recording (_hold_directory)."""

    # -- the sampler's side ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = named_thread(self._run, "gpumon-recorder")
        self._thread.start()

    def submit(self, tick: Tick) -> None:
        """From the sampler, after each tick: never waits on the disk (unless `block`)."""
        try:
            if self._block:
                self._wake.set()
                self._queue.put(tick)
            else:
                self._queue.put_nowait(tick)
        except queue.Full:
            with self._lock:
                self._stats = self._stats._replace(dropped_ticks=self._stats.dropped_ticks + 1)
        if self._block or self._queue.qsize() >= self._wake_at:
            self._wake.set()

    def flush(self) -> None:
        """Wait until every submitted tick is handed to the OS, decodable (tests, shutdown)."""
        self._queue.put(_SYNC)
        self._wake.set()
        self._queue.join()

    def release(self) -> None:
        """A `held` recorder takes its ticks from now on (those queued meanwhile at once)."""
        self._released.set()
        self._wake.set()

    def close(self, timeout_s: float = 2.0) -> None:
        """Write what is queued, end the segment cleanly, stop the thread."""
        self._released.set()  # a stop before the first sample: no wait for it
        if self._thread is None:
            return
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            log.warning("recorder: the disk is too slow to take the last ticks: they are dropped")
        self._wake.set()
        self._thread.join(timeout_s)
        self._thread = None

    def stats(self) -> RecorderStats:
        with self._lock:
            return self._stats

    # -- the recorder's thread ---------------------------------------------------------------------

    def _run(self) -> None:
        self._released.wait(HOLD_MAX_S)
        while True:
            woken = self._wake.wait(SYNC_EVERY_S)
            self._wake.clear()
            while True:  # what was queued since: written in one go
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                try:
                    if item is None:
                        self._guarded(self._end_segment, "stopped")
                        self._release_directory()
                        return
                    if isinstance(item, Tick):
                        self._guarded(self._record, item)
                    else:
                        self._guarded(self._sync, None)
                finally:
                    self._queue.task_done()
            # in real time, every SYNC_EVERY_S; woken for every tick (`block`), after SYNC_EVERY_S
            # without one (a stalled sampler, a replay that ended, a slow simulation): its last ticks
            if not self._block or not woken:
                self._guarded(self._sync, None)

    def _guarded(self, step: Callable[[Any], None], arg: Any) -> None:
        try:
            step(arg)
        except Exception:  # a bug here must not take the daemon down: pause, say so, retry
            self._internal_error(arg if isinstance(arg, Tick) else None)

    def _sync(self, _: None = None) -> None:
        if self._writer is None:
            return
        try:
            self._writer.sync()
        except OutputError as e:
            self._pause(self._newest_unix, e)

    def _internal_error(self, tick: Tick | None) -> None:
        unix = tick.t_s + self._unix_offset() if tick is not None else self._newest_unix
        if self._paused_since is None:
            log.exception("recorder: paused by an internal error; retrying every %g s", RETRY_S)
            self._paused_since = unix
        self._retry_at = unix + RETRY_S
        self._not_recorded += 1
        self._dropped(1)
        self._error("internal error (see the log)")
        w, self._writer = self._writer, None
        if w is not None:
            try:
                w.close(None, None)
            except Exception:  # releasing the file is all that is wanted here
                pass
            self._closed_bytes += w.bytes

    def _record(self, tick: Tick) -> None:
        unix = tick.t_s + self._unix_offset()
        self._newest_unix = unix
        if self._paused_since is not None and unix < self._retry_at:
            self._not_recorded += 1
            self._dropped(1)
            return
        bucket = int(unix // self.segment_s)
        writer = self._writer
        if writer is not None and (
            bucket != self._bucket or writer.bytes >= max(1_000_000, self.max_bytes // 10)
        ):
            self._end_segment("rotated")
            writer = None
        try:
            if writer is None:
                writer = self._new_segment(tick, unix, bucket)
            writer.write_tick(tick)
            if not writer.still_at_path():
                gone = not os.path.isdir(self.directory)
                raise OutputError(
                    f"{self.directory}: removed or moved while recording into it; recording resumes "
                    "when it is back (mkdir it, or restart gpumon)"
                    if gone
                    else f"{writer.path}: the segment was removed or replaced while being written"
                )
        except OutputError as e:
            self._pause(unix, e)
            return
        if self._paused_since is not None:
            log.info(
                "recorder: resumed in %s after %.0f s; %d tick(s) were not recorded",
                self.directory,
                unix - self._paused_since,
                self._not_recorded,
            )
            self._paused_since = None
            self._not_recorded = 0
        with self._lock:
            self._stats = self._stats._replace(
                up=True,
                paused_reason=None,
                bytes_written=self._closed_bytes + writer.bytes,
                newest_unix_s=unix,
            )
        if self._last_retention is None or unix - self._last_retention >= RETENTION_EVERY_S:
            self._retention(unix)

    def _new_segment(self, tick: Tick, unix: float, bucket: int) -> TraceWriterV2:
        if self._made_directory and not os.path.isdir(self.directory):
            raise OutputError(
                f"{self.directory}: removed or moved while recording into it; recording resumes when "
                "it is back (mkdir it, or restart gpumon)"
            )
        try:
            os.makedirs(self.directory, mode=0o750, exist_ok=True)
        except OSError as e:
            raise OutputError(f"{self.directory}: cannot create the directory: {e.strerror}") from None
        self._made_directory = True
        self._hold_directory()
        origin = tick.t_s - self._interval_s  # the first tick lands at interval_s, as `record`'s
        from gpumon.trace.records import make_header  # after the first sample (see `held`)

        header = make_header(self._source, self._interval_s)
        header["started_unix_s"] = round(unix - self._interval_s, 6)
        n = 0
        while True:
            path = os.path.join(self.directory, segment_name(unix, n))
            try:
                writer = self._open_writer(path, header, origin)
                break
            except OutputError:
                if not os.path.exists(path) or n >= 100:
                    raise
                n += 1  # a segment from a run that started within the same second
        self._writer = writer
        self._bucket = bucket
        self._seg_start_unix = unix
        self._retention(unix)
        return writer

    def _hold_directory(self) -> None:
        """The directory's lock (LOCK_NAME, flock), held while this recorder lives: a second daemon
        recording into the same directory wrote segments beside the first's, whose ticks
        `analyze --from` then skipped as out of order (found by a hostile-input pass). Without the
        lock, recording pauses, says who holds it, and tries again every RETRY_S (so it takes over
        when the other stops). Taken again when the directory was removed and made anew."""
        path = os.path.join(self.directory, LOCK_NAME)
        fd = self._lock_fd
        if fd is not None:
            try:
                here, there = os.fstat(fd), os.stat(path, follow_symlinks=False)
                if (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino):
                    return  # still the directory's own lock
            except OSError:
                pass
            os.close(fd)
            self._lock_fd = None
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o640)
        except OSError as e:
            raise OutputError(f"{path}: cannot open the recorder's lock: {e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "?"
            except OSError:
                holder = "?"
            os.close(fd)
            raise OutputError(
                f"{self.directory}: another gpumon records here (pid {holder[:20]}); this one "
                "records when it stops (give each daemon a record_dir of its own)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _release_directory(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # (the lock goes with it)
            self._lock_fd = None

    def _end_segment(self, reason: str | None) -> None:
        writer = self._writer
        if writer is None:
            return
        self._writer = None
        try:
            writer.close(writer.last_t_s, reason if not writer.failed else None)
        except OutputError as e:
            self._error(f"{e}")
        self._closed_bytes += writer.bytes
        with self._lock:
            self._stats = self._stats._replace(bytes_written=self._closed_bytes)
        self._retention(self._newest_unix)

    def _pause(self, unix: float, e: OutputError) -> None:
        reason = str(e).split("; the ", 1)[0]
        if self._paused_since is None:
            log.warning(
                "recorder: paused: %s; serving and the detector go on; retrying every %g s", reason, RETRY_S
            )
            self._paused_since = unix
        self._retry_at = unix + RETRY_S
        self._not_recorded += 1
        self._dropped(1)
        self._error(reason)
        w = self._writer
        self._writer = None
        if w is not None:
            try:
                w.close(None, None)  # release the file; it reads to its last whole record
            except OutputError:
                pass
            self._closed_bytes += w.bytes

    def _error(self, reason: str) -> None:
        with self._lock:
            self._stats = self._stats._replace(up=False, paused_reason=reason, errors=self._stats.errors + 1)

    def _dropped(self, n: int) -> None:
        with self._lock:
            self._stats = self._stats._replace(dropped_ticks=self._stats.dropped_ticks + n)

    def _set(self, **kw: Any) -> None:
        with self._lock:
            self._stats = self._stats._replace(**kw)

    def _retention(self, now_unix: float) -> None:
        """Delete the oldest segments while all their samples are older than max_age_s, or while
        the segments together exceed max_bytes; never the one being written."""
        self._last_retention = now_unix
        current = self._writer.path if self._writer is not None else None
        segments = list_segments(self.directory)
        total = sum(s.bytes for s in segments)
        kept = []
        for i, seg in enumerate(segments):
            if seg.path == current:
                kept.append(seg)
                continue
            ends = segments[i + 1].start_unix_s if i + 1 < len(segments) else now_unix
            too_old = ends < now_unix - self.max_age_s
            if (too_old or total > self.max_bytes) and not kept:
                try:
                    os.unlink(seg.path)
                    total -= seg.bytes
                    continue
                except FileNotFoundError:
                    total -= seg.bytes
                    continue
                except OSError as e:
                    self._error(f"{seg.path}: cannot delete: {e.strerror}")
            kept.append(seg)
        with self._lock:
            self._stats = self._stats._replace(
                segments=len(kept),
                disk_bytes=total,
                oldest_unix_s=kept[0].start_unix_s if kept else None,
            )


def unix_offset_of(clock: Any, real_time: bool) -> Callable[[], float]:
    """Tick time -> Unix time: followed live on a real clock (wall-clock steps are seen), fixed at
    start on a simulated one (whose time runs at its own pace)."""
    if real_time:
        return lambda: time.time() - clock.now()
    fixed = time.time() - clock.now()
    return lambda: fixed


def _open_segment_file(path: str, header: dict[str, Any], origin_s: float) -> TraceWriterV2:
    """A segment's writer (imported with its encoders when the first segment opens)."""
    from gpumon.trace.writer import TraceWriterV2  # with json and gzip: after the first sample

    return TraceWriterV2(path, header, origin_s=origin_s, sync_every_s=SYNC_EVERY_S)
