"""`gpumon report --job ID`: one job's verdicts, gathered from where gpumon keeps them.

Two ways in:
- the daemons' state APIs (`--url`, default the local one): each GPU the job holds, its recent
  episodes since the job began (the prolog wrote when), time by state, waste, the suggestion;
- a Prometheus server (`--prometheus`) over a time range: every node of a multi-node job at once,
  time by state per GPU from `gpumon_gpu_state`, waste from `gpumon_gpu_wasted_seconds_total`, both
  joined to `gpumon_gpu_job_info`.

Either way the job as a whole gets a verdict, and the straggler is named: the GPU(s) starved while
most of the job's other GPUs sit in sync-stall, waiting in a collective for them.

The Slurm epilog runs this, so it must end whatever the servers do: each request has a total
deadline (not one per read) and a bounded body (gpumon.core.fetch); an answer that is not JSON, or
not shaped as gpumon's or Prometheus' answers are, is exit 9 naming the URL; text from a server
is shown without its control characters (no terminal escapes); credentials come from the URL
(`http://user:pass@host:9877`) or `--basic-auth`, and are never printed.
"""

from __future__ import annotations

import json
import math
import time
import urllib.parse
from collections import defaultdict
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from gpumon.analyze.job_fix import gpu_fix_line, job_fix_lines, straggler_history
from gpumon.analyze.trace_report import SUGGESTIONS
from gpumon.core import fetch
from gpumon.core.errors import EXIT_UNREACHABLE, GpumonError
from gpumon.core.terminal import printable
from gpumon.detect.stragglers import StragglerHistory, history
from gpumon.detect.vocabulary import main_label

SUGGESTIONS_STRAGGLER = (
    "the whole job waits for this rank: feed its input pipeline (more loader workers on that node, "
    "a faster local copy of its shard), or balance the input across ranks"
)
STEP_S = 15.0
"""Prometheus query resolution: a state counts in steps this long."""
DAEMON_DEADLINE_S = 10.0
PROMETHEUS_DEADLINE_S = 30.0
"""Each request's whole answer must come within this (a server that trickles is cut off)."""
MAX_BODY_BYTES = 64 * 1024 * 1024
"""A day of a job on 8 GPUs at 15 s steps is about 15 MB of Prometheus JSON; a state, tens of KB."""


class ReportError(GpumonError):
    """A daemon or Prometheus that cannot be read, or a job they do not know."""

    exit_code = EXIT_UNREACHABLE

    def __init__(self, message: str) -> None:
        super().__init__(printable(message))


@contextmanager
def _shaped(url: str) -> Iterator[None]:
    """An answer that is JSON but not shaped as expected: exit 9 naming the URL, not a traceback."""
    try:
        yield
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise ReportError(
            f"{fetch.redacted(url)}: not the answer gpumon expects ({type(e).__name__}: {str(e)[:80]})"
        ) from None


@dataclass
class GpuJobReport:
    node: str
    index: int
    uuid: str
    seconds_by_label: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    wasted_gpu_s: float = 0.0
    episodes: list[dict[str, Any]] = field(default_factory=list)
    now: str | None = None
    advice: dict[str, Any] | None = None
    """What a fix buys on this GPU now (the state API's `advice`; docs/detector.md)."""

    @property
    def main_label(self) -> str:
        return main_label(self.seconds_by_label)


@dataclass
class JobReport:
    job_id: str
    user: str | None
    scheduler: str
    source: str
    since_unix_s: float | None
    until_unix_s: float | None
    gpus: list[GpuJobReport]
    stragglers: list[tuple[GpuJobReport, str]] = field(default_factory=list)
    now_unix_s: float | None = None
    """When the daemons were asked (an episode going on ends there)."""
    history: StragglerHistory[Hashable] | None = None
    """Who straggled when, where the report has a timeline rather than episodes (Prometheus)."""

    @property
    def wasted_gpu_s(self) -> float:
        return sum(g.wasted_gpu_s for g in self.gpus)


def find_stragglers(labels: dict[tuple[str, int], str]) -> list[tuple[tuple[str, int], str]]:
    """GPUs starved while most of the job's other GPUs sit in sync-stall: the ranks the job waits
    for. All ranks starved (a slow shared filesystem, say) is not a straggler: nobody waits."""
    starved = [(k, v) for k, v in labels.items() if v.startswith("starved")]
    if not starved:
        return []
    others = [v for k, v in labels.items() if not v.startswith("starved")]
    if not others:
        return []
    syncing = sum(v == "sync-stall" for v in others)
    return starved if syncing > len(others) / 2 else []


def verdict_line(rep: JobReport) -> str:
    if not rep.gpus:
        return "no GPU of this job was seen"
    if rep.stragglers:
        names = ", ".join(f"{g.node} GPU {g.index} ({label})" for g, label in rep.stragglers)
        waiting = sum(g.main_label == "sync-stall" for g in rep.gpus)
        return f"STRAGGLER: {names}, while {waiting} of the job's other GPUs waited in sync-stall"
    labels = {g.main_label for g in rep.gpus}
    starved = [g for g in rep.gpus if g.main_label.startswith("starved")]
    if starved and len(starved) == len(rep.gpus):
        return f"STARVED: every GPU of the job ({', '.join(sorted({g.main_label for g in starved}))})"
    if starved:
        return f"partly starved: {len(starved)} of {len(rep.gpus)} GPU(s)"
    return ", ".join(sorted(labels)).upper() if labels else "unknown"


def render(rep: JobReport) -> str:

    nodes = sorted({g.node for g in rep.gpus})
    span = ""
    if rep.since_unix_s is not None and rep.until_unix_s is not None:
        fmt = "%Y-%m-%d %H:%M:%S"
        span = (
            f", {time.strftime(fmt, time.localtime(rep.since_unix_s))} - "
            f"{time.strftime(fmt, time.localtime(rep.until_unix_s))}"
        )
    lines = [
        f"gpumon report: {rep.scheduler} job {rep.job_id}"
        + (f" (user {rep.user})" if rep.user else "")
        + f" on {len(rep.gpus)} GPU(s) across {len(nodes)} node(s){span} (from {rep.source})",
        f"job verdict: {verdict_line(rep)}",
        *fix_lines(rep),
        f"wasted: {rep.wasted_gpu_s / 3600:.3f} GPU-hours ({rep.wasted_gpu_s:.0f} GPU-s)",
    ]
    straggling = {(g.node, g.index) for g, _ in rep.stragglers}
    for g in sorted(rep.gpus, key=lambda g: (g.node, g.index)):
        total = sum(g.seconds_by_label.values()) or 1.0
        lines.append("")
        mark = "   <- the straggler" if (g.node, g.index) in straggling else ""
        lines.append(f"{g.node}  GPU {g.index}  {g.uuid or '?'}{mark}")
        head = f"  verdict: {g.main_label.upper()}"
        if g.now and g.now != g.main_label:
            head += f" most of the time; {g.now.upper()} now"
        lines.append(head)
        shares = sorted(g.seconds_by_label.items(), key=lambda kv: -kv[1])
        lines.append(
            "  time:    " + ", ".join(f"{k} {v:.0f} s ({v / total:.0%})" for k, v in shares if v > 0)
        )
        lines.append(f"  wasted:  {g.wasted_gpu_s / 3600:.4f} GPU-hours ({g.wasted_gpu_s:.0f} GPU-s)")
        if g.episodes:
            lines.append(f"  episodes ({len(g.episodes)}):")
            for e in g.episodes[-8:]:
                end = e.get("end_unix_s")
                when = time.strftime("%H:%M:%S", time.localtime(e["start_unix_s"]))
                dur = f"{end - e['start_unix_s']:.0f} s" if end is not None else "going on"
                lines.append(
                    f"    {when}  {e['label']:<14} ({dur}, wasted {e.get('wasted_gpu_s') or 0:.0f} GPU-s)"
                )
        suggestion = (
            SUGGESTIONS_STRAGGLER if (g.node, g.index) in straggling else SUGGESTIONS.get(g.main_label)
        )
        if suggestion:
            lines.append(f"  suggest: {suggestion}")
        fix = gpu_fix_line(g)
        if fix:
            lines.append(fix)
    return printable("\n".join(lines))


def fix_lines(rep: JobReport) -> list[str]:
    """What fixing the job buys it: its straggler's fix (a data-parallel job steps at its slowest
    rank), and SPDL's rule on a straggler that moves between ranks."""
    moving = rep.history or straggler_history(rep.gpus, rep.now_unix_s or time.time())
    return job_fix_lines(rep.gpus, [g for g, _ in rep.stragglers], moving)


def to_json(rep: JobReport) -> dict[str, Any]:
    return {
        "schema": "gpumon-job-report/1",
        "job_id": rep.job_id,
        "user": rep.user,
        "scheduler": rep.scheduler,
        "source": rep.source,
        "since_unix_s": rep.since_unix_s,
        "until_unix_s": rep.until_unix_s,
        "verdict": verdict_line(rep),
        "wasted_gpu_s": round(rep.wasted_gpu_s, 3),
        "stragglers": [{"node": g.node, "gpu": g.index, "label": label} for g, label in rep.stragglers],
        "fix": fix_lines(rep),
        "gpus": [
            {
                "node": g.node,
                "gpu": g.index,
                "uuid": g.uuid,
                "verdict": g.main_label,
                "now": g.now,
                "seconds_in_state": {k: round(v, 3) for k, v in g.seconds_by_label.items() if v > 0},
                "wasted_gpu_s": round(g.wasted_gpu_s, 3),
                "episodes": g.episodes,
                "advice": g.advice,
            }
            for g in rep.gpus
        ],
    }


# -- from daemons ---------------------------------------------------------------------------------


def _get_json(url: str, timeout_s: float = DAEMON_DEADLINE_S, auth: str | None = None) -> Any:
    headers = fetch.basic_header(auth) if auth else {}
    try:
        status, body = fetch.get(url, timeout_s, MAX_BODY_BYTES, headers)
    except fetch.FetchError as e:
        raise ReportError(str(e)) from None
    shown = fetch.redacted(url)
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        if status != 200:
            raise ReportError(f"{shown}: answered HTTP {status}") from None
        raise ReportError(f"{shown}: not JSON ({str(e)[:80]})") from None
    if status != 200:
        why = doc.get("error") if isinstance(doc, dict) else None
        raise ReportError(f"{shown}: answered HTTP {status}" + (f": {str(why)[:200]}" if why else ""))
    return doc


def from_daemons(
    job_id: str,
    urls: list[str],
    since: float | None,
    until: float | None,
    auth: str | None = None,
    timeout_s: float | None = None,
) -> JobReport:
    gpus: list[GpuJobReport] = []
    user = None
    scheduler = "slurm"
    for url in urls:
        state = _get_json(url.rstrip("/") + "/api/v1/state", timeout_s or DAEMON_DEADLINE_S, auth)
        with _shaped(url):
            user, scheduler, now_unix = _from_state(job_id, url, state, since, until, gpus, user, scheduler)
    if not gpus:
        shown = ", ".join(fetch.redacted(u) for u in urls)
        raise ReportError(f"job {job_id}: no GPU of it is known to {shown}")
    rep = JobReport(job_id, user, scheduler, ", ".join(fetch.redacted(u) for u in urls), since, until, gpus)
    rep.now_unix_s = now_unix
    _mark_stragglers(rep)
    return rep


def _from_state(
    job_id: str,
    url: str,
    state: Any,
    since: float | None,
    until: float | None,
    gpus: list[GpuJobReport],
    user: str | None,
    scheduler: str,
) -> tuple[str | None, str, float]:
    """One daemon's GPUs of the job into `gpus`; the job's user and scheduler as far as known, and the
    daemon's time (what an open episode runs to)."""
    if not isinstance(state, dict) or not state.get("ready"):
        raise ReportError(f"{fetch.redacted(url)}: gpumon is not ready yet")
    node = str(state.get("hostname") or urllib.parse.urlsplit(url).hostname)
    now_unix = _time(state.get("time_unix_s")) or time.time()
    for g in state.get("gpus", []):
        mine = [j for j in g.get("jobs", []) if str(j.get("job_id")) == job_id]
        if not mine:
            continue
        user = user or mine[0].get("user")
        scheduler = mine[0].get("scheduler", scheduler)
        gr = GpuJobReport(node, int(g["index"]), str(g.get("uuid", "")), now=g.get("label"))
        gr.advice = g.get("advice") if isinstance(g.get("advice"), dict) else None
        began = mine[0].get("started_unix_s")  # when the prolog ran: earlier episodes were others'
        began_unix = _time(began)
        lo = since if since is not None else (began_unix if began_unix is not None else -math.inf)
        hi = until if until is not None else now_unix
        for e in g.get("episodes", []):
            start, end = _time(e["start_unix_s"]), _time(e.get("end_unix_s")) or now_unix
            if start is None or not isinstance(e["label"], str):
                raise ValueError(f"an episode without a start time or a label: {str(e)[:60]}")
            overlap = min(end, hi) - max(start, lo)
            if overlap <= 0:
                continue
            gr.episodes.append(e)
            gr.seconds_by_label[e["label"]] += overlap
            share = overlap / max(end - start, 1e-9)
            wasted = float(e.get("wasted_gpu_s") or 0.0)
            if not math.isfinite(wasted):
                raise ValueError(f"wasted_gpu_s {wasted}")
            gr.wasted_gpu_s += wasted * share
        gpus.append(gr)
    return user, scheduler, now_unix


def _time(value: Any) -> float | None:
    """A Unix time from a server, or None; ValueError for anything that is not one."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e11:
        raise ValueError(f"not a time: {str(value)[:40]}")
    return float(value)


def _mark_stragglers(rep: JobReport) -> None:
    by_key = {(g.node, g.index): g for g in rep.gpus}
    found = find_stragglers({k: g.main_label for k, g in by_key.items()})
    rep.stragglers = [(by_key[k], label) for k, label in found]


# -- from Prometheus ------------------------------------------------------------------------------


def _prom(
    base: str,
    query: str,
    start: float,
    end: float,
    step: float = STEP_S,
    auth: str | None = None,
    timeout_s: float | None = None,
) -> list[dict[str, Any]]:
    params = urllib.parse.urlencode(
        {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    )
    url = f"{base.rstrip('/')}/api/v1/query_range?{params}"
    doc = _get_json(url, timeout_s or PROMETHEUS_DEADLINE_S, auth)
    shown = fetch.redacted(base)
    if not isinstance(doc, dict) or doc.get("status") != "success":
        why = doc.get("error") if isinstance(doc, dict) else "not a Prometheus answer"
        raise ReportError(f"{shown}: the query failed: {str(why)[:200]}")
    with _shaped(base):
        result = doc["data"]["result"]
        if not isinstance(result, list) or not all(
            isinstance(r, dict) and isinstance(r.get("metric"), dict) and isinstance(r.get("values"), list)
            for r in result
        ):
            raise ValueError("data.result is not a list of series")
        for r in result:  # samples at no time, or of no value (NaN, +Inf): none of gpumon's
            r["values"] = [(t, v) for t, v in r["values"] if _finite(t) and _finite(v)]
    return result


def from_prometheus(
    job_id: str,
    base: str,
    since: float,
    until: float,
    auth: str | None = None,
    timeout_s: float | None = None,
) -> JobReport:
    with _shaped(base):
        return _from_prometheus(job_id, base, since, until, auth, timeout_s)


def _from_prometheus(
    job_id: str, base: str, since: float, until: float, auth: str | None, timeout_s: float | None
) -> JobReport:
    sel = f'job_id="{_escape(job_id)}"'
    info = f"gpumon_gpu_job_info{{{sel}}}"
    states = _prom(
        base,
        f"{info} * on(instance, gpu, uuid) group_left(state) (gpumon_gpu_state == 1)",
        since,
        until,
        auth=auth,
        timeout_s=timeout_s,
    )
    if not states:
        raise ReportError(
            f"job {job_id}: Prometheus at {fetch.redacted(base)} has no GPU of it between the times asked"
        )
    gpus: dict[tuple[str, int], GpuJobReport] = {}
    user = None
    scheduler = "slurm"
    timeline: dict[float, dict[tuple[str, int], str]] = defaultdict(dict)
    for series in states:
        m = series["metric"]
        node = m.get("instance", "?")
        key = (node, int(m.get("gpu", -1)))
        gpus.setdefault(key, GpuJobReport(node, key[1], m.get("uuid", "")))
        user = user or m.get("user") or None
        scheduler = m.get("scheduler", scheduler)
        label = m.get("state", "unknown")
        for t, _ in series["values"]:
            timeline[float(t)][key] = label
    causes = _prom(
        base,
        f"{info} * on(instance, gpu, uuid) group_left(cause) (gpumon_gpu_starvation_cause == 1)",
        since,
        until,
        auth=auth,
        timeout_s=timeout_s,
    )
    cause_at: dict[tuple[float, tuple[str, int]], str] = {}
    for series in causes:
        m = series["metric"]
        key = (m.get("instance", "?"), int(m.get("gpu", -1)))
        for t, _ in series["values"]:
            cause_at[(float(t), key)] = m.get("cause", "")
    straggling: dict[tuple[str, int], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    spans: dict[Hashable, list[tuple[float, float, str]]] = defaultdict(list)
    for t, labels in sorted(timeline.items()):
        full = {
            k: (f"{v}-{cause_at[(t, k)]}" if v == "starved" and (t, k) in cause_at else v)
            for k, v in labels.items()
        }
        for k, v in full.items():
            gpus[k].seconds_by_label[v] += STEP_S
            gpus[k].now = v
        for k, v in find_stragglers(full):
            straggling[k][v] += STEP_S
        for k, v in full.items():  # each step a stretch of the GPU's timeline: who straggled when
            spans[f"{k[0]} GPU {k[1]}"].append((t, t + STEP_S, v))
    window = max(STEP_S, until - since)
    wasted = _prom(
        base,
        f"{info} * on(instance, gpu, uuid) group_left "
        f"increase(gpumon_gpu_wasted_seconds_total[{window:.0f}s])",
        until,
        until,
        STEP_S,
        auth,
        timeout_s,
    )
    for series in wasted:
        m = series["metric"]
        key = (m.get("instance", "?"), int(m.get("gpu", -1)))
        if key in gpus and series["values"]:
            gpus[key].wasted_gpu_s = float(series["values"][-1][1])
    rep = JobReport(
        job_id, user, scheduler, f"Prometheus {fetch.redacted(base)}", since, until, list(gpus.values())
    )
    rep.history = history(spans)
    # a straggler is one for a good part of the range, not for one unlucky step
    total = window
    rep.stragglers = [
        (gpus[k], max(by_label, key=lambda lb: by_label[lb]))
        for k, by_label in straggling.items()
        if sum(by_label.values()) >= min(120.0, total / 4)
    ]
    return rep


def _finite(x: Any) -> bool:
    """A sample's time or value as Prometheus writes them ("1.5", "NaN", "+Inf"): a finite number.
    ValueError (the answer's shape is wrong) for one that is no number at all."""
    return math.isfinite(float(x))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
