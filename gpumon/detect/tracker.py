"""Hysteresis, episodes and wasted GPU-seconds: a small state machine per GPU. No clock, no I/O:
time comes with the windows it is fed."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import InitVar, dataclass, field
from typing import Any, NamedTuple

from gpumon.core.model import GpuSample, UtilPoint
from gpumon.detect.classify import Classification, classify, starting_work
from gpumon.detect.evidence import (
    KERNEL_SM_ACTIVE,
    PERIOD_POINTS,
    Evidence,
    GpuWindow,
    JobKey,
    another_job,
    at_rest,
    gather,
    job_key,
    job_label,
    sample_period,
)
from gpumon.detect.thresholds import DEFAULT_THRESHOLDS, Thresholds
from gpumon.detect.vocabulary import WASTEFUL, Cause, State, state_label

MAX_EPISODES_KEPT = 200
"""Closed episodes remembered per GPU, by default (`episodes_kept`): what `analyze` and `report` list
(totals are kept whole). The daemon keeps fewer: the state API's (gpumon.serve.sampling)."""
KERNEL_TICKS = 5
KERNEL_SECONDS = 5.0
"""Ticks in a row with SM activity (KERNEL_TICKS of them, over KERNEL_SECONDS at least, whatever the
interval) that say a job NVML's utilization shows nothing of runs kernels (it steps), where a
start-up's one-off kernels (initialisation, a warm-up) are a second or two: the job has then run,
and is judged (starved, underutilized ...) rather than `starting`."""
STARTING_QUIET_S = 120.0
"""Past `starting_grace_s`, a job that has run no kernel stays `starting` while it was seen working on
the host within this long (Thresholds.starting_busy_s): a preparation that pauses (between files,
while it waits for a lock) is not taken for a hang at each pause. At 60 s, a preparation pausing a
little longer between its bursts of work went starting -> stalled -> starting ten times in one
start-up (a reviewer's finding); a hang is taken for one this much later."""
MAX_CAUSES_KEPT = 32
"""Cause changes remembered per episode: its first cause and the latest changes. A starved episode
can last days while its cause swings between cpu and io every few minutes; every change kept, it
grew without end, and so did each tick's copy of it (its seconds per cause are kept whole)."""


class Episode(NamedTuple):
    index: int  # type: ignore[assignment]  # the GPU's index, not tuple.index
    uuid: str
    state: State
    cause: Cause | None
    """The cause that held longest in the episode (its label's, from its seconds per cause, all
    kept); `causes` has how it began and its latest changes (MAX_CAUSES_KEPT)."""
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
    """(from when, cause) for the causes the episode had, in order: the state is confirmed on its own,
    and the cause refines within the episode (host, then cpu, as a job's workers show up). The first
    and the latest MAX_CAUSES_KEPT - 1 changes: an entry then holds until the next one's time, the
    first until the second's only when nothing was dropped between them."""
    job: str | None = None
    """The job that held the GPU (`slurm 4242`, `pid 123`): an episode never spans two jobs."""
    causes_dropped: int = 0
    """Cause changes left out of `causes` between its first entry and the rest (MAX_CAUSES_KEPT)."""

    @property
    def label(self) -> str:
        return state_label(self.state, self.cause)

    def duration_s(self, now_s: float) -> float:
        return (self.end_s if self.end_s is not None else now_s) - self.start_s


def named_cause(cause_s: Mapping[Cause | None, float], now: Cause | None) -> Cause | None:
    """The cause an episode is named for: the one held longest (`cause_s`, seconds per cause, in
    the order they came: the first on a tie); `now` while it has had one cause only."""
    return max(cause_s, key=cause_s.__getitem__) if len(cause_s) > 1 else now


class Verdict(NamedTuple):
    t_s: float
    index: int  # type: ignore[assignment]  # the GPU's index, not tuple.index
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
    if state == State.SYNC_STALL and evidence.waiting_share is not None:
        return min(1.0, evidence.waiting_share)  # waiting for a starved rank that share of each step
    if state in (State.STALLED, State.SYNC_STALL) or evidence.duty_cycle is None:
        return 1.0
    if state == State.UNDERUTILIZED and evidence.sm_active is not None:
        return max(0.0, 1.0 - evidence.sm_active)  # GPM: the SMs left waiting, busy or not
    return max(0.0, 1.0 - evidence.duty_cycle)


@dataclass(eq=False)  # state, not a value: equal only to itself
class _Open:
    """The episode under way: its state, cause, start and what it has seen so far."""

    state: State
    cause: Cause | None
    start_s: float
    first_reason: InitVar[str]
    causes: list[tuple[float, Cause | None]] = field(default_factory=list)
    causes_dropped: int = 0
    """Changes left out of `causes` to keep it at MAX_CAUSES_KEPT (Episode.causes_dropped)."""
    job: str | None = None
    cause_s: dict[Cause | None, float] = field(default_factory=dict)
    """Seconds with each cause: the longest names a closed episode."""
    reasons: dict[Cause | None, str] = field(default_factory=dict)
    """The latest reason given with each cause: an episode's reason is its name's (a job's teardown
    that reads `host` for its last seconds leaves a starved-cpu episode its CPU reason)."""
    wasted_gpu_s: float = 0.0
    duty_sum: float = 0.0
    duty_n: int = 0
    agreed_duty_sum: float = 0.0
    agreed_duty_n: int = 0
    """The same over the windows whose own classification agrees with the episode: its mean duty,
    where it has any (an idle episode's last windows, the next job's first kernels awaiting their
    confirmation, read 80-99% busy: the demo's idle start read "mean duty 78%")."""
    recent: deque[tuple[float, float, Evidence]] = field(default_factory=deque)
    """Agreeing windows whole inside the episode, not yet a window older than the last agreeing one."""
    settled: tuple[float, dict[str, Any]] | None = None
    """(duty, evidence) of the lowest-duty settled window: the steady part's worst."""
    fallback: tuple[float, dict[str, Any]] | None = None
    """(duty, evidence) of the lowest-duty agreeing window anywhere in the episode (for episodes
    too short to settle); the evidence made a dict once, when found, not each time it is read (the
    open episode is published on every tick)."""

    def __post_init__(self, first_reason: str) -> None:
        self.reasons[self.cause] = first_reason

    @property
    def reason(self) -> str:
        """The latest reason given with the cause now: the live verdict's."""
        return self.reasons[self.cause]

    @property
    def worst(self) -> dict[str, Any] | None:
        if self.settled is not None:
            return self.settled[1]
        return self.fallback[1] if self.fallback is not None else None


@dataclass(eq=False)  # state, not a value: equal only to itself
class StarvationDetector:
    """Feed it one window per tick for one GPU; it answers with the (hysteresis-held) verdict."""

    thresholds: Thresholds = DEFAULT_THRESHOLDS
    expected_period_s: float | None = None
    seconds_in_state: dict[State, float] = field(default_factory=lambda: dict.fromkeys(State, 0.0))
    wasted_gpu_s: float = 0.0
    episodes_started: dict[str, int] = field(default_factory=dict)
    starved_seconds_by_cause: dict[Cause, float] = field(default_factory=dict)
    episodes_kept: int = MAX_EPISODES_KEPT
    """Closed episodes remembered (each holds its worst window's evidence: ~4.5 KB)."""

    def __post_init__(self) -> None:
        self.episodes: deque[Episode] = deque(maxlen=self.episodes_kept)
        self._open: _Open | None = None
        self._candidate: State | None = None
        """A state seen but not yet confirmed (the cause does not take part: see feed)."""
        self._candidate_since = 0.0
        self._cause_candidate: Cause | None = None
        self._cause_since = 0.0
        self._last_t: float | None = None
        self._index, self._uuid = -1, ""
        self._job: JobKey | None = None
        self._job_label: str | None = None
        self._job_since = 0.0
        self._job_busy_t: float | None = None
        """When the job now on the GPU, before its first kernel, was last seen working on the host
        (see Thresholds.starting_busy_s)."""
        self._last_sample_t: float | None = None
        self._gpm_read = False
        """The tick before had a GPM reading: after a failed one, GPM's next covers both ticks."""
        self._gpm_run: tuple[float, float, int] | None = None
        """GPM's SM activity in the ticks in a row so far, while the job has run no kernel NVML saw:
        (the start of the first one's interval, its time, how many ticks); None: not now."""
        self._wasted_shown = (0.0, 0.0)
        """(wasted_gpu_s, it rounded as verdicts show it): a GPU that wastes nothing gives the same
        float every tick (the range API's verdict log keeps 15 minutes of them)."""
        self._job_arrival: tuple[float, float] | None = None
        """(last sample before, first sample of) the job now on the GPU, when this detector saw it
        come (not when it held the GPU from the first window): what gather needs of its arrival."""
        """When this detector first saw the job now on the GPU."""
        self._job_ran = False
        """The job now on the GPU has run a kernel since it appeared."""
        self._job_work_since: float | None = None
        """When it ran its first, if this detector saw the job start up (its window starts there)."""
        self._job_waited = False
        """This detector saw the job start up (young, no kernel yet): once it runs, its window
        starts at its first kernel."""
        self._rest: tuple[Verdict, float, Thresholds] | None = None
        """(the verdict, when, under which thresholds) of the last window judged, where it found the
        GPU idle with nothing in its whole, full window: what `carry` carries on."""

    @property
    def state(self) -> State:
        return self._open.state if self._open else State.UNKNOWN

    @property
    def current(self) -> Episode | None:
        return self._as_episode(self._open, None) if self._open else None

    def feed(self, window: GpuWindow, mig_instances: int = 0, waiting_for: Verdict | None = None) -> Verdict:
        """`mig_instances`: the GPU is in MIG mode with that many instances (judged on their own).
        `waiting_for`: the previous verdict of another GPU of the same job, starved then (the
        rank this one may wait for: FleetDetector finds it)."""
        th = self.thresholds
        t = window.t_s
        self._index, self._uuid = window.gpu.index, window.gpu.uuid
        new_job = self._follow_job(window)
        ev = gather(window, th, self._job_work_since, self._job_arrival)
        theirs_duty = waiting_for.evidence.duty_cycle if waiting_for is not None else None
        if waiting_for is not None and theirs_duty is not None:
            theirs = waiting_for.evidence
            ev = ev._replace(
                waiting_for_gpu=waiting_for.index,
                waiting_share=round(1.0 - theirs_duty, 4),
                waiting_for_power_ratio=theirs.power_ratio,
            )
        starting_s = self._starting_s(t, ev, len(window.hosts))
        # A window not yet full (just started, samples missing) lowers the confidence.
        expected = round(th.window_s / ev.period_s) if ev.period_s else None
        if self._open is None:
            self._open = _Open(State.UNKNOWN, None, t, "starting", job=self._job_label)
        elif new_job:
            # Episodes follow jobs: the old one's ends here, and the new job is judged afresh.
            self._switch((State.UNKNOWN, None), t, "another job took the GPU: judging it from now")
            self._candidate = self._cause_candidate = None
        if mig_instances:
            raw = Classification(
                State.MIG, None, 1.0, f"in MIG mode: its {mig_instances} instance(s) are judged on their own"
            )
        else:
            raw = classify(
                ev,
                th,
                self._open.state,
                window.gpu.available,
                expected_points=expected,
                starting_s=starting_s,
            )
        if raw.state == State.STARTING:
            self._job_waited = True
        key = (raw.state, raw.cause)
        op = self._open
        # The state is confirmed on its own: a starved GPU whose cause reads host, then io, then cpu
        # while its job's workers show up is starved after confirm_s all the same. The cause then
        # refines inside the episode, each change confirmed for confirm_s too.
        if raw.state == op.state:
            self._candidate = None
            if raw.cause == op.cause:
                self._cause_candidate = None
                op.reasons[raw.cause] = raw.reason
            elif self._cause_candidate != raw.cause:
                self._cause_candidate, self._cause_since = raw.cause, t
            elif t - self._cause_since >= th.confirm_s - 1e-9:
                op.cause = raw.cause
                op.reasons[raw.cause] = raw.reason
                if len(op.causes) >= MAX_CAUSES_KEPT:
                    del op.causes[1]  # the first cause stays: how the episode began
                    op.causes_dropped += 1
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
        verdict = Verdict(
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
            wasted_gpu_s=self._wasted_rounded(),
        )
        self._rest = None
        if (
            raw.state == State.IDLE
            and op.state == State.IDLE
            and self._candidate is None
            and ev.duty_cycle == 0.0
            and not ev.has_job
            and expected is not None
            and ev.points >= expected  # a full window (one filling up is judged as it fills)
            and waiting_for is None
            and not mig_instances
        ):
            self._rest = (verdict, t, th)
        return verdict

    def carry(
        self, t_s: float, g: GpuSample, shape_of: Callable[[GpuSample], tuple[int, float | None]]
    ) -> Verdict | None:
        """The verdict at `t_s` of a GPU at rest, without its window: where the last window judged
        found it idle with nothing in the whole window, a full window of driver samples less than
        a window ago (under the same thresholds), this tick's sample `g` shows nothing on it
        (evidence.at_rest), and its window is still full (`shape_of(g)`: how many driver samples
        it holds and their period, read without cutting it, asked last), its idle verdict goes on
        as it was, with that window's evidence (a GPU at rest is judged from its window once a
        window). None: judge its window (`feed`).

        Such a GPU's window holds only zeros and no process, and the new sample adds the same:
        judged, it reads idle again, and nothing of the job-following state changes but what is
        set here. Full then and now, its confidence (the idle rule's, times the window's fill) is
        the same; a window no longer full at its samples' period (a driver waking to sub-second
        samples, samples missing) is judged. An idle daemon judged every GPU's window on every
        tick: 0.07% of a core, of 0.22%, for 8 idle GPUs at a 1 s cadence on the stand-in driver
        (docs/benchmarks.md)."""
        rest = self._rest
        if rest is None:
            return None
        verdict, judged_t, th = rest
        if th is not self.thresholds or not 0.0 <= t_s - judged_t < th.window_s or not at_rest(g):
            return None
        points, period_s = shape_of(g)
        if not period_s or points < max(th.min_points, round(th.window_s / period_s)):
            return None  # not a full window (as classify counts it): judged
        # what _follow_job does for a GPU that has no job and had none
        self._last_sample_t = g.t_s
        self._gpm_read = g.gpm is not None
        self._account(t_s, verdict.evidence, agrees=True)
        return verdict._replace(t_s=t_s)

    def _wasted_rounded(self) -> float:
        raw, shown = self._wasted_shown
        if raw != self.wasted_gpu_s:
            raw, shown = self.wasted_gpu_s, round(self.wasted_gpu_s, 3)
            self._wasted_shown = (raw, shown)
        return shown

    def _follow_job(self, window: GpuWindow) -> bool:
        """Which job holds the GPU now, and whether it has run a kernel since it was first seen;
        True when another job took the GPU from one that held it (no idle moment between)."""
        key = job_key(window.gpu)
        new_job = another_job(self._job, key)
        arrived = new_job or (key is None) != (self._job is None)
        if arrived:
            self._job_since, self._job_ran, self._job_work_since = window.t_s, False, None
            self._job_waited = False
            self._job_busy_t = None
            self._gpm_run = None
            # seen to come only after a window before it (the detector's first window has no past)
            before = self._last_sample_t
            self._job_arrival = None if before is None else (before, window.gpu.t_s)
        prev_t = self._last_sample_t
        self._last_sample_t = window.gpu.t_s
        had_gpm, self._gpm_read = self._gpm_read, window.gpu.gpm is not None
        if key != self._job:
            self._job, self._job_label = key, job_label(window.gpu)
        if key is not None and not self._job_ran:
            gap, since = self.thresholds.gap_util, self._job_since
            later = [p for p in window.points if p.t_s > since]
            # not the first of them: its period may have begun before the job came (the job
            # before's last kernels, or a straddling sample)
            first = next((p for p in later[1:] if p.util_ratio > gap), None)
            # (the arrival's tick never counts: its GPM interval may reach back before the job)
            stepping = None if arrived else self._gpm_stepping(window.gpu, prev_t if had_gpm else None)
            ran = first.t_s if first is not None else stepping
            if ran is not None:
                self._job_ran = True
                if self._job_waited:  # it was seen before its first kernel: its work starts here
                    self._job_work_since = ran
        return new_job

    def _gpm_stepping(self, g: GpuSample, prev_t: float | None) -> float | None:
        """Where GPM has said kernels ran in each tick in a row up to `g`, at least KERNEL_TICKS of
        them over at least KERNEL_SECONDS, when the first of them was. Counted tick by tick, not
        within the detector's window, so that neither a short window nor a long interval keeps
        the run from its length. `prev_t`: the tick before, where it had a GPM reading."""
        a = g.gpm
        if a is None or a.sm_active_ratio is None or a.sm_active_ratio < KERNEL_SM_ACTIVE:
            self._gpm_run = None
            return None
        run = self._gpm_run
        if run is None:
            if prev_t is None:
                # no reading the tick before (a failed one: this one reaches back over it, perhaps
                # to before the job came): a run starts at a reading that covers one tick
                return None
            # each tick's GPM activity is over the interval since the tick before it
            run = (prev_t, g.t_s, 0)
        start, first, n = run
        self._gpm_run = (start, first, n + 1)
        if n + 1 >= KERNEL_TICKS and g.t_s - start >= KERNEL_SECONDS - 1e-9:
            return first
        return None

    def _starting_s(self, t: float, ev: Evidence, host_samples: int) -> float | None:
        """How long ago the job on the GPU started, while it has run no kernel yet and is within
        the start-up grace: its oldest process's age from the host; where the host cannot see its
        processes (it has reported twice without them), since this detector first saw the job."""
        if self._job is None or self._job_ran:
            return None
        th = self.thresholds
        if starting_work(ev, th):
            self._job_busy_t = t  # working on the host: preparing, not hung
        if ev.job_age_s is not None:
            age = ev.job_age_s
        elif host_samples >= 2 and not ev.job_seen_on_host:
            age = t - self._job_since
        else:
            return None  # not known yet (the host's first reading of a process is its baseline)
        if age < th.starting_grace_s:
            return age
        busy = self._job_busy_t is not None and t - self._job_busy_t <= STARTING_QUIET_S
        return age if busy and age < th.starting_busy_s else None

    def _switch(self, key: tuple[State, Cause | None], since: float, reason: str) -> None:
        old = self._open
        if old is not None and since > old.start_s:  # an episode of no length is no episode
            self.episodes.append(self._as_episode(old, since))
        self._open = _Open(key[0], key[1], since, reason, causes=[(since, key[1])], job=self._job_label)
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
        op.agreed_duty_sum += duty
        op.agreed_duty_n += 1
        window = self.thresholds.window_s
        if op.fallback is None or duty < op.fallback[0]:
            op.fallback = (duty, ev.as_dict())
        if t - window >= op.start_s - 1e-9:
            op.recent.append((t, duty, ev))
        while op.recent and op.recent[0][0] <= t - window + 1e-9:
            _, d, e = op.recent.popleft()
            if op.settled is None or d < op.settled[0]:
                op.settled = (d, e.as_dict())

    def _as_episode(self, op: _Open, end: float | None) -> Episode:
        cause = named_cause(op.cause_s, op.cause)
        return Episode(
            index=self._index,
            uuid=self._uuid,
            state=op.state,
            cause=cause,
            start_s=op.start_s,
            end_s=end,
            wasted_gpu_s=round(op.wasted_gpu_s, 3),
            mean_duty=_mean_duty(op),
            worst=op.worst,
            reason=op.reasons.get(cause, op.reason),
            causes=tuple(op.causes),
            job=op.job,
            causes_dropped=op.causes_dropped,
        )

    def close(self, t_s: float) -> list[Episode]:
        """End of input: the open episode ends now; returns every episode kept."""
        out = list(self.episodes)
        if self._open is not None:
            out.append(self._as_episode(self._open, t_s))
        return out


class FleetDetector:
    """One StarvationDetector per GPU (keyed by index and UUID, so a replaced board starts fresh)."""

    def __init__(
        self, thresholds: Thresholds = DEFAULT_THRESHOLDS, episodes_kept: int = MAX_EPISODES_KEPT
    ) -> None:
        self.thresholds = thresholds
        self.episodes_kept = episodes_kept
        self.gpus: dict[tuple[int, str], StarvationDetector] = {}
        self._last: dict[tuple[int, str], Verdict] = {}
        """The previous tick's verdicts: a GPU's starved peers are read from them."""

    def feed(self, windows: list[GpuWindow]) -> list[Verdict]:
        """The verdicts of one tick's windows (one per GPU, all at the same time)."""
        if not windows:
            self._last = {}
            return []
        by_gpu = {id(w.gpu): w for w in windows}
        return self.judge(
            windows[0].t_s,
            [w.gpu for w in windows],
            lambda g: by_gpu[id(g)],
            lambda g: _shape(by_gpu[id(g)].points),
        )

    def judge(
        self,
        t_s: float,
        gpus: Sequence[GpuSample],
        window_of: Callable[[GpuSample], GpuWindow | None],
        shape_of: Callable[[GpuSample], tuple[int, float | None]],
    ) -> list[Verdict]:
        """The verdicts of one tick at `t_s`: each GPU of `gpus` judged from its window, cut by
        `window_of` (None: no history, no verdict) only where it is needed: a GPU at rest carries
        its idle verdict on without one (StarvationDetector.carry), from the number of driver
        samples its window holds and their period (`shape_of`, which cuts nothing)."""
        instances: dict[int, int] = {}
        for g in gpus:
            if g.mig is not None:
                instances[g.index] = instances.get(g.index, 0) + 1
        starved = self._starved_by_job(gpus)
        out = []
        last: dict[tuple[int, str], Verdict] = {}
        for g in gpus:
            key = (g.index, g.uuid)
            det = self.gpus.get(key)
            parent_of = instances.get(g.index, 0) if g.mig is None else 0
            verdict = det.carry(t_s, g, shape_of) if det is not None and not parent_of else None
            if verdict is None:
                w = window_of(g)
                if w is None:
                    continue
                if det is None:
                    det = StarvationDetector(self.thresholds, episodes_kept=self.episodes_kept)
                    self.gpus[key] = det
                peer = self._waited_for(g, key, starved) if starved and g.mig is None else None
                verdict = det.feed(w, mig_instances=parent_of, waiting_for=peer)
            last[key] = verdict
            out.append(verdict)
        self._last = last
        return out

    def _starved_by_job(self, gpus: Sequence[GpuSample]) -> dict[tuple[str, str], list[Verdict]]:
        """The GPUs starved at the previous tick, by each job they are attributed to (MIG
        instances aside: their power is not their own)."""
        out: dict[tuple[str, str], list[Verdict]] = {}
        previous = self._last
        if not previous:
            return out
        for g in gpus:
            v = previous.get((g.index, g.uuid))
            if v is None or v.state != State.STARVED or g.mig is not None:
                continue
            for job in g.jobs:
                out.setdefault((job.scheduler, job.job_id), []).append(v)
        return out

    def _waited_for(
        self, g: GpuSample, key: tuple[int, str], starved: dict[tuple[str, str], list[Verdict]]
    ) -> Verdict | None:
        """The starved GPU of this GPU's own job with the most gaps, if any: the rank it would be
        waiting for. Only GPUs attributed to a job have peers (two jobs side by side never wait
        for each other)."""
        found = [
            v
            for job in g.jobs
            for v in starved.get((job.scheduler, job.job_id), ())
            if (v.index, v.uuid) != key and v.evidence.duty_cycle is not None
        ]
        return min(found, key=lambda v: v.evidence.duty_cycle or 0.0) if found else None


def _shape(points: Sequence[UtilPoint]) -> tuple[int, float | None]:
    """A window's driver samples: how many, and their period (as gather reads it)."""
    return len(points), sample_period(points[-PERIOD_POINTS:])


def _mean_duty(op: _Open) -> float | None:
    """An episode's mean duty cycle: over its windows that read its own state and cause, else (none
    did: a short episode of changes) over all of its windows."""
    if op.agreed_duty_n:
        return round(op.agreed_duty_sum / op.agreed_duty_n, 4)
    return round(op.duty_sum / op.duty_n, 4) if op.duty_n else None
