"""What a fix buys, per GPU and episode: the remedy model (detect/remedies.py) fed the median of an
episode's steady windows, not one noisy window. A small state machine fed the verdicts of each
tick; no clock, no I/O: time comes with the verdicts."""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from gpumon.detect.classify import classify
from gpumon.detect.remedies import MIN_WINDOWS, Advice, RemedyInputs, healthy, median_inputs, predict
from gpumon.detect.stragglers import stragglers
from gpumon.detect.thresholds import DEFAULT_THRESHOLDS, Thresholds
from gpumon.detect.tracker import MAX_EPISODES_KEPT, Verdict, named_cause
from gpumon.detect.vocabulary import Cause, State

KEPT_WINDOWS = 60
"""The newest steady windows of an episode its advice is the median of (a minute at 1 s ticks): a
long episode's advice follows what the job does now."""
RECOMPUTE_S = 5.0
"""An open episode's advice is worked out again at most this often (it changes slowly; a starved
GPU's advice costs a few hundred microseconds)."""

GpuKey = tuple[int, str]


class HeldWindow(NamedTuple):
    """A healthy episode's steady window."""

    t_s: float
    duty: float
    cause: Cause | None
    """Under the fed line, the cause the window reads as if the GPU were not fed, where the model
    scales it (cpu, io); None otherwise."""
    inputs: RemedyInputs | None


@dataclass(eq=False)  # state, not a value: equal only to itself
class _Episode:
    """One GPU's episode as the advisor follows it: its steady windows per cause."""

    start_s: float
    state: State
    cause: Cause | None
    """The cause now (the verdict's): what the GPU's live advice is for."""
    windows: defaultdict[Cause | None, deque[tuple[float, RemedyInputs]]] = field(
        default_factory=lambda: defaultdict(lambda: deque(maxlen=KEPT_WINDOWS))
    )
    """Steady windows per cause: a cause that comes back (cpu, then host for a job's teardown, then
    cpu) finds its windows still there, and no cause's windows mix into another's median."""
    held: deque[HeldWindow] = field(default_factory=lambda: deque(maxlen=KEPT_WINDOWS))
    """A healthy episode's newest steady windows: their duty, and under the fed line the cause they
    read as if the GPU were not fed (and their inputs), one record each so that every count and
    median is over the same newest minute (remedies.healthy, Advisor._advise_healthy)."""
    held_by: Thresholds | None = None
    """The thresholds `held` was classified by: a reload starts it afresh."""
    cause_s: dict[Cause | None, float] = field(default_factory=dict)
    """Seconds with each cause, counted as the detector counts them: the longest names the episode
    (Episode.cause), and so says which cause its advice is for."""
    last_t: float | None = None
    advice: Advice | None = None
    advised_t_s: float = -float("inf")
    changes: int = 0
    """Bumped when any cause's windows (or the cause) change: the advice is a function of them."""
    advised: tuple[int, Thresholds, Cause | None] | None = None
    """(changes, thresholds, the cause now) when `advice` was worked out."""

    @property
    def label_cause(self) -> Cause | None:
        """The cause the episode is named for, by the detector's rule."""
        return named_cause(self.cause_s, self.cause)


class Advisor:
    """Feed it every tick's verdicts; ask it for each GPU's advice now, or per episode."""

    def __init__(
        self, thresholds: Thresholds = DEFAULT_THRESHOLDS, episodes_kept: int = MAX_EPISODES_KEPT
    ) -> None:
        self.thresholds = thresholds
        self._episodes_kept = episodes_kept
        """Closed episodes' advice remembered per GPU (`episodes`), as the detector's episodes."""
        self._open: dict[GpuKey, _Episode] = {}
        self._closed: dict[GpuKey, deque[tuple[float, Advice | None]]] = {}

    def feed(self, verdicts: Sequence[Verdict]) -> None:
        window = self.thresholds.window_s
        peers = _peer_cores(verdicts)
        for v in verdicts:
            key = (v.index, v.uuid)
            ep = self._open.get(key)
            if ep is None or ep.start_s != v.since_s or ep.state != v.state:
                last_t = None
                if ep is not None:
                    self._close(key, ep)
                    last_t = ep.last_t  # the detector's clock runs on: a new episode's first tick counts
                ep = self._open[key] = _Episode(v.since_s, v.state, v.cause, last_t=last_t)
            if ep.cause != v.cause:  # the cause refined (host, then cpu), or a teardown's changed it
                ep.cause = v.cause
                ep.changes += 1
            dt = 0.0 if ep.last_t is None else min(v.t_s - ep.last_t, window)
            ep.last_t = v.t_s
            ep.cause_s[v.cause] = ep.cause_s.get(v.cause, 0.0) + dt
            # the episode's steady windows: its own label, and whole inside it (not its onset)
            steady = v.raw.label == v.label and v.t_s - window >= v.since_s - 1e-9
            if v.state == State.STARVED and steady:
                inputs = RemedyInputs.of(v.evidence, peers.get(key, 0.0))
                if inputs is not None:
                    ep.windows[v.cause].append((v.t_s, inputs))
                    ep.changes += 1
            elif v.state == State.HEALTHY and steady:
                ev = v.evidence
                duty = ev.duty_since_change if ev.duty_since_change is not None else ev.duty_cycle
                if duty is not None:
                    if ep.held_by is not self.thresholds:
                        ep.held.clear()
                        ep.held_by = self.thresholds
                    ep.held.append(self._held(v, duty, peers.get(key, 0.0)))
                    ep.changes += 1

    def _held(self, v: Verdict, duty: float, peer_cores: float) -> HeldWindow:
        """A healthy steady window; under the fed line (held healthy by the hysteresis), the cause
        the classifier names with `underutilized` as the state it holds: its fed line is then
        fed_duty + hysteresis, as a starved GPU's, and a pause (a checkpoint) still reads as one.
        Kept where the model scales it (cpu, io), with the window's inputs."""
        if duty < self.thresholds.fed_duty:
            raw = classify(v.evidence, self.thresholds, State.UNDERUTILIZED)
            if raw.state == State.STARVED and raw.cause in (Cause.CPU, Cause.IO):
                inputs = RemedyInputs.of(v.evidence, peer_cores)
                if inputs is not None:
                    return HeldWindow(v.t_s, duty, raw.cause, inputs)
        return HeldWindow(v.t_s, duty, None, None)

    def _close(self, key: GpuKey, ep: _Episode) -> None:
        kept = self._closed.setdefault(key, deque(maxlen=self._episodes_kept))
        kept.append((ep.start_s, self._advise(ep, ep.label_cause)))

    def _advise(self, ep: _Episode, cause: Cause | None) -> Advice | None:
        """The model for `cause` on the median of the episode's steady windows with that cause, less
        their last window's worth when enough are left (a job's teardown: its loaders gone while
        the GPU still reads starved)."""
        if ep.state == State.HEALTHY:
            return self._advise_healthy(ep)
        windows = list(ep.windows.get(cause, ()))
        if windows:
            settled = [i for t, i in windows if t <= windows[-1][0] - self.thresholds.window_s]
            chosen = settled if len(settled) >= len(windows) // 2 and settled else [i for _, i in windows]
            saturated = self.thresholds.pinned_core
            return predict(ep.state, cause, median_inputs(chosen), len(chosen), saturated)
        return predict(ep.state, cause, None, 0)

    def _advise_healthy(self, ep: _Episode) -> Advice:
        """Fed, unless the episode's newest steady windows sit under the fed line (remedies.healthy);
        then, where most of those under it read a cause the model scales as if the GPU were not
        fed, the model for that cause on their median (a loader that holds the GPU at 77% gains
        from what gains a starved one), else "cannot predict". All over the same newest minute."""
        import statistics  # (and fractions, decimal): only once an episode has windows to take

        held = list(ep.held)
        n = len(held)
        duty = statistics.median(w.duty for w in held) if n else None
        fed_line = self.thresholds.fed_duty
        if duty is not None and duty < fed_line and n >= MIN_WINDOWS:
            under = sum(1 for w in held if w.duty < fed_line)
            by_cause: dict[Cause, list[HeldWindow]] = {}
            for w in held:
                if w.cause is not None:
                    by_cause.setdefault(w.cause, []).append(w)
            if by_cause:
                # the most windows; on a tie, the cause read last
                cause, windows = max(by_cause.items(), key=lambda cw: (len(cw[1]), cw[1][-1].t_s))
                if 2 * len(windows) > under and len(windows) >= MIN_WINDOWS:
                    inputs = median_inputs([w.inputs for w in windows if w.inputs is not None])
                    advice = predict(State.STARVED, cause, inputs, len(windows), self.thresholds.pinned_core)
                    if advice is not None:
                        return advice
        return healthy(duty, fed_line, n)

    def current(self, key: GpuKey, t_s: float | None = None) -> Advice | None:
        """The advice for the GPU's episode now, for its cause now (the live verdict's): worked out
        again at most every RECOMPUTE_S of `t_s`, and at once when the cause changed."""
        ep = self._open.get(key)
        if ep is None:
            return None
        # at most every RECOMPUTE_S, and only when a window came (or went) since: an episode with
        # no steady windows (any state but starved or healthy) is worked out once
        # the cause the advice was worked out for, not its own (a healthy GPU's names the cause its
        # windows read as if not fed, while the verdict has none)
        cause_changed = ep.advised is not None and ep.advised[2] != ep.cause
        if t_s is None or t_s - ep.advised_t_s >= RECOMPUTE_S or cause_changed:
            basis = (ep.changes, self.thresholds, ep.cause)
            if ep.advised != basis:
                ep.advice = self._advise(ep, ep.cause)
                ep.advised = basis
            ep.advised_t_s = t_s if t_s is not None else ep.advised_t_s
        return ep.advice

    def episodes(self, key: GpuKey) -> dict[float, Advice | None]:
        """Each episode's advice by its start (the one going on last), for the cause that names it
        (held longest): an episode starved on CPU for a minute whose job's teardown read `host` for
        its last seconds is advised on its CPU windows, as it is named."""
        out = dict(self._closed.get(key, ()))
        ep = self._open.get(key)
        if ep is not None:
            out[ep.start_s] = self._advise(ep, ep.label_cause)
        return out


def _peer_cores(verdicts: Sequence[Verdict]) -> dict[GpuKey, float]:
    """For each straggler of the tick (starved while most GPUs with a job wait in sync-stall), the
    CPU of the processes of the GPUs waiting for it, where the host sees them: the job's other
    ranks on this host, whose steps grow with the straggler's."""
    labels = {(v.index, v.uuid): v.label for v in verdicts if v.evidence.has_job}
    found = stragglers(labels)
    if not found:
        return {}
    waiting = sum(
        v.evidence.job_cpu_cores or 0.0
        for v in verdicts
        if v.state == State.SYNC_STALL and v.evidence.job_seen_on_host
    )
    return dict.fromkeys(found, waiting)
