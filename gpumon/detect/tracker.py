"""Hysteresis, episodes and wasted GPU-seconds: a small state machine per GPU. No clock, no I/O:
time comes with the windows it is fed."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

from gpumon.detect.classify import Classification, classify
from gpumon.detect.evidence import Evidence, GpuWindow, gather
from gpumon.detect.thresholds import DEFAULT_THRESHOLDS, Thresholds
from gpumon.detect.vocabulary import WASTEFUL, Cause, State, state_label

MAX_EPISODES_KEPT = 200
"""Closed episodes remembered per GPU (a long-running daemon stays bounded; totals are kept)."""


@dataclass(frozen=True, slots=True)
class Episode:
    index: int
    uuid: str
    state: State
    cause: Cause | None
    """The cause that held longest in the episode (its label's); `causes` has every change."""
    start_s: float
    end_s: float | None
    """None while it goes on."""
    wasted_gpu_s: float
    mean_duty: float | None
    worst: dict[str, Any] | None
    """The evidence of the window with the lowest duty cycle in the episode's steady part: among
    the windows whose own classification agrees with the episode, those lying whole inside it and
    a whole window before its end (so never a job's start-up or teardown). An episode too short to
    have one shows the lowest-duty window that agrees with it."""
    reason: str
    causes: tuple[tuple[float, Cause | None], ...] = ()
    """(from when, cause) for each cause the episode had, in order: the state is confirmed on its own,
    and the cause refines within the episode (host, then cpu, as a job's workers show up)."""

    @property
    def label(self) -> str:
        return state_label(self.state, self.cause)

    def duration_s(self, now_s: float) -> float:
        return (self.end_s if self.end_s is not None else now_s) - self.start_s


@dataclass(frozen=True, slots=True)
class Verdict:
    t_s: float
    index: int
    uuid: str
    name: str
    state: State
    cause: Cause | None
    confidence: float
    since_s: float
    reason: str
    evidence: Evidence
    raw: Classification
    """What this window alone says, before hysteresis."""
    wasted_gpu_s: float
    """GPU-seconds wasted since the detector started, all episodes together."""

    @property
    def label(self) -> str:
        return state_label(self.state, self.cause)


def waste_share(state: State, evidence: Evidence) -> float:
    """Share of a second of GPU time wasted in this state: the idle share of a starved or
    underutilized GPU (with GPM, of an underutilized one: the share of SMs idle); all of it for a
    stalled GPU or one spinning in a collective."""
    if state not in WASTEFUL:
        return 0.0
    if state in (State.STALLED, State.SYNC_STALL) or evidence.duty_cycle is None:
        return 1.0
    if state == State.UNDERUTILIZED and evidence.sm_active is not None:
        return max(0.0, 1.0 - evidence.sm_active)  # GPM: the SMs left waiting, busy or not
    return max(0.0, 1.0 - evidence.duty_cycle)


@dataclass
class _Open:
    state: State
    cause: Cause | None
    start_s: float
    reason: str
    causes: list[tuple[float, Cause | None]] = field(default_factory=list)
    cause_s: dict[Cause | None, float] = field(default_factory=dict)
    """Seconds with each cause: the longest names a closed episode."""
    wasted_gpu_s: float = 0.0
    duty_sum: float = 0.0
    duty_n: int = 0
    recent: deque[tuple[float, float, Evidence]] = field(default_factory=deque)
    """Agreeing windows whole inside the episode, not yet a window older than the last agreeing one."""
    settled: tuple[float, dict[str, Any]] | None = None
    """(duty, evidence) of the lowest-duty settled window: the steady part's worst."""
    fallback: tuple[float, Evidence] | None = None
    """The lowest-duty agreeing window anywhere in the episode (for episodes too short to settle)."""

    @property
    def worst(self) -> dict[str, Any] | None:
        if self.settled is not None:
            return self.settled[1]
        return self.fallback[1].as_dict() if self.fallback is not None else None


@dataclass
class StarvationDetector:
    """Feed it one window per tick for one GPU; it answers with the (hysteresis-held) verdict."""

    thresholds: Thresholds = DEFAULT_THRESHOLDS
    expected_period_s: float | None = None
    seconds_in_state: dict[State, float] = field(default_factory=lambda: dict.fromkeys(State, 0.0))
    wasted_gpu_s: float = 0.0
    episodes_started: dict[str, int] = field(default_factory=dict)
    starved_seconds_by_cause: dict[Cause, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.episodes: deque[Episode] = deque(maxlen=MAX_EPISODES_KEPT)
        self._open: _Open | None = None
        self._candidate: State | None = None
        """A state seen but not yet confirmed (the cause does not take part: see feed)."""
        self._candidate_since = 0.0
        self._cause_candidate: Cause | None = None
        self._cause_since = 0.0
        self._last_t: float | None = None
        self._index, self._uuid = -1, ""

    @property
    def state(self) -> State:
        return self._open.state if self._open else State.UNKNOWN

    @property
    def current(self) -> Episode | None:
        return self._as_episode(self._open, None) if self._open else None

    def feed(self, window: GpuWindow) -> Verdict:
        th = self.thresholds
        t = window.t_s
        self._index, self._uuid = window.gpu.index, window.gpu.uuid
        ev = gather(window, th)
        # A window not yet full (just started, samples missing) lowers the confidence.
        expected = round(th.window_s / ev.period_s) if ev.period_s else None
        if self._open is None:
            self._open = _Open(State.UNKNOWN, None, t, "starting")
        raw = classify(ev, th, self._open.state, window.gpu.available, expected_points=expected)
        key = (raw.state, raw.cause)
        op = self._open
        # The state is confirmed on its own: a starved GPU whose cause reads host, then io, then cpu
        # while its job's workers show up is starved after confirm_s all the same. The cause then
        # refines inside the episode, each change confirmed for confirm_s too.
        if raw.state == op.state:
            self._candidate = None
            if raw.cause == op.cause:
                self._cause_candidate = None
                op.reason = raw.reason
            elif self._cause_candidate != raw.cause:
                self._cause_candidate, self._cause_since = raw.cause, t
            elif t - self._cause_since >= th.confirm_s - 1e-9:
                op.cause, op.reason = raw.cause, raw.reason
                op.causes.append((self._cause_since, raw.cause))
                self._cause_candidate = None
        else:
            if self._candidate != raw.state:
                # confirmed from when the samples show the change, where the window shows it: the
                # new behaviour has then been seen confirm_s long, not only this tick's verdict
                since = t if raw.since_s is None else max(t - raw.since_s, op.start_s)
                self._candidate, self._candidate_since = raw.state, since
            if t - self._candidate_since >= th.confirm_s - 1e-9:
                self._switch((raw.state, raw.cause), self._candidate_since, raw.reason)
                self._candidate = self._cause_candidate = None
        op = self._open
        self._account(t, ev, agrees=key == (op.state, op.cause))
        confidence = raw.confidence if key == (op.state, op.cause) else round(raw.confidence * 0.5, 3)
        return Verdict(
            t_s=t,
            index=window.gpu.index,
            uuid=window.gpu.uuid,
            name=window.gpu.name,
            state=op.state,
            cause=op.cause,
            confidence=confidence,
            since_s=op.start_s,
            reason=op.reason,
            evidence=ev,
            raw=raw,
            wasted_gpu_s=round(self.wasted_gpu_s, 3),
        )

    def _switch(self, key: tuple[State, Cause | None], since: float, reason: str) -> None:
        old = self._open
        if old is not None and since > old.start_s:  # an episode of no length is no episode
            self.episodes.append(self._as_episode(old, since))
        self._open = _Open(key[0], key[1], since, reason, causes=[(since, key[1])])
        label = state_label(*key)
        self.episodes_started[label] = self.episodes_started.get(label, 0) + 1

    def _account(self, t: float, ev: Evidence, agrees: bool) -> None:
        op = self._open
        assert op is not None
        dt = 0.0 if self._last_t is None else min(t - self._last_t, self.thresholds.window_s)
        self._last_t = t
        self.seconds_in_state[op.state] = self.seconds_in_state.get(op.state, 0.0) + dt
        op.cause_s[op.cause] = op.cause_s.get(op.cause, 0.0) + dt
        if op.cause is not None:
            self.starved_seconds_by_cause[op.cause] = self.starved_seconds_by_cause.get(op.cause, 0.0) + dt
        wasted = dt * waste_share(op.state, ev)
        self.wasted_gpu_s += wasted
        op.wasted_gpu_s += wasted
        duty = ev.duty_cycle
        if duty is None:
            return
        op.duty_sum += duty
        op.duty_n += 1
        if not agrees:
            return  # a window that says something else (a teardown, a start-up): never the evidence
        window = self.thresholds.window_s
        if op.fallback is None or duty < op.fallback[0]:
            op.fallback = (duty, ev)
        if t - window >= op.start_s - 1e-9:
            op.recent.append((t, duty, ev))
        while op.recent and op.recent[0][0] <= t - window + 1e-9:
            _, d, e = op.recent.popleft()
            if op.settled is None or d < op.settled[0]:
                op.settled = (d, e.as_dict())

    def _as_episode(self, op: _Open, end: float | None) -> Episode:
        cause = max(op.cause_s, key=lambda c: op.cause_s[c]) if len(op.cause_s) > 1 else op.cause
        return Episode(
            index=self._index,
            uuid=self._uuid,
            state=op.state,
            cause=cause,
            start_s=op.start_s,
            end_s=end,
            wasted_gpu_s=round(op.wasted_gpu_s, 3),
            mean_duty=round(op.duty_sum / op.duty_n, 4) if op.duty_n else None,
            worst=op.worst,
            reason=op.reason,
            causes=tuple(op.causes),
        )

    def close(self, t_s: float) -> list[Episode]:
        """End of input: the open episode ends now; returns every episode kept."""
        out = list(self.episodes)
        if self._open is not None:
            out.append(replace(self._as_episode(self._open, t_s)))
        return out


class FleetDetector:
    """One StarvationDetector per GPU (keyed by index and UUID, so a replaced board starts fresh)."""

    def __init__(self, thresholds: Thresholds = DEFAULT_THRESHOLDS) -> None:
        self.thresholds = thresholds
        self.gpus: dict[tuple[int, str], StarvationDetector] = {}

    def feed(self, windows: list[GpuWindow]) -> list[Verdict]:
        out = []
        for w in windows:
            key = (w.gpu.index, w.gpu.uuid)
            det = self.gpus.get(key)
            if det is None:
                det = self.gpus[key] = StarvationDetector(self.thresholds)
            out.append(det.feed(w))
        return out
