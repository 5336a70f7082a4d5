"""Which job holds which GPU: the attribution source, beside NVML and the host.

Sources, tried in order for each GPU (docs/fleet.md):
1. The mapping directory written by gpumon's Slurm prolog (contrib/slurm/gpumon-prolog), default
   /run/gpumon/jobs: one file per GPU and job, `gpu<INDEX>.job<JOBID>`, key=value lines under a
   `gpumon-job v1` line.
2. dcgm-exporter's layout (`--hpc-job-mapping-dir`), for sites that already run its prolog: files
   named by GPU index, one job id per line.
3. The GPU's processes themselves: /proc/PID/cgroup names the Slurm job (cgroup v2
   `.../slurmstepd.scope/job_<id>/step_<n>/...`, v1 `/slurm/uid_<uid>/job_<id>/step_<n>`). No
   prolog and no privilege needed; it sees only processes in this PID namespace.

Bad input never stops the others: a file that is empty, unreadable, garbage, or from an earlier
boot is skipped, with one log line per file (until it changes). Reading is cheap: a directory
listing per tick, and a file read again only when its modification time changes; a process's
cgroup is read once (it does not change jobs).
"""

from __future__ import annotations

import logging
import os
import pwd
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpumon.collect.sources.kubelet import KubeletClient, device_key, pod_ref
from gpumon.core.model import AttributionStatus, GpuSample, JobRef
from gpumon.core.problems import Problems

log = logging.getLogger("gpumon.jobs")

DEFAULT_JOBS_DIR = "/run/gpumon/jobs"
_FILE = re.compile(r"^gpu(\d+)\.job([0-9A-Za-z_.+-]+)$")
_V2 = re.compile(r"/job_(\d+)(?:/step_([0-9a-z_]+))?")
_POD = re.compile(
    r"kubepods[^:]*?pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
)
_CONTAINER = re.compile(r"(?:cri-containerd-|crio-|docker-|containerd-)?([0-9a-f]{64})(?:\.scope)?$")
_V1 = re.compile(r"/slurm/uid_(\d+)/job_(\d+)(?:/step_([0-9a-z_]+))?")
MAX_FILE_BYTES = 4096


@dataclass(frozen=True)
class MappedJob:
    gpu_index: int
    gpu_uuid: str | None
    ref: JobRef


def parse_mapping_file(name: str, text: str, boot_id: str | None) -> MappedJob:
    """One prolog file -> the job it names. ValueError(reason) for anything else."""
    m = _FILE.match(name)
    if m is None:
        raise ValueError("not a gpumon job file name (gpu<INDEX>.job<JOBID>)")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ValueError("empty")
    if lines[0] != "gpumon-job v1":
        raise ValueError("not a gpumon job file (its first line must be 'gpumon-job v1')")
    values: dict[str, str] = {}
    for ln in lines[1:]:
        key, sep, value = ln.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"not a key=value line: {ln[:60]!r}")
        values[key] = value
    job = values.get("job_id", "")
    if not job or job != m.group(2):
        raise ValueError("its job_id does not match its name")
    if values.get("gpu_index") not in (None, m.group(1)):
        raise ValueError("its gpu_index does not match its name")
    if boot_id and values.get("boot_id") and values["boot_id"] != boot_id:
        raise ValueError("stale: written before this machine's last boot")
    array = values.get("array_job_id")
    task = values.get("array_task_id")
    shown = f"{array}_{task}" if array and task else job
    try:
        started: float | None = float(values["written_unix_s"]) if "written_unix_s" in values else None
    except ValueError:
        raise ValueError("written_unix_s is not a number") from None
    ref = JobRef(values.get("scheduler") or "slurm", shown, values.get("user") or None, None, "prolog")
    return MappedJob(int(m.group(1)), values.get("gpu_uuid") or None, ref._replace(started_unix_s=started))


def parse_pod_cgroup(text: str) -> tuple[str, str | None] | None:
    """/proc/PID/cgroup -> (pod UID, container id) of a Kubernetes pod, or None. The cgroup names
    the pod's UID, not its name: such a GPU is named by UID (docs/kubernetes.md)."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        m = _POD.search(path)
        if m:
            c = _CONTAINER.search(path.rsplit("/", 1)[-1])
            return m.group(1).replace("_", "-"), c.group(1)[:12] if c else None
    return None


def parse_cgroup(text: str) -> tuple[str, str | None, int | None] | None:
    """/proc/PID/cgroup -> (job id, step, uid) of a Slurm job, or None."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        m1 = _V1.search(path)
        if m1:
            return m1.group(2), m1.group(3), int(m1.group(1))
        if "slurm" in path:
            m2 = _V2.search(path)
            if m2:
                return m2.group(1), m2.group(2), None
    return None


@dataclass
class _Cached:
    mtime_ns: int
    job: MappedJob | None


@dataclass
class JobSource:
    """Maps GPUs to the jobs holding them; `poll` returns the GPUs with their `jobs` filled in."""

    problems: Problems
    jobs_dir: str | None = DEFAULT_JOBS_DIR
    dcgm_dir: str | None = None
    cgroups: bool = True
    proc: str = "/proc"
    kubelet: KubeletClient | None = None
    name: str = "jobs"
    _files: dict[str, _Cached] = field(default_factory=dict)
    _dcgm: dict[str, tuple[int, tuple[str, ...]]] = field(default_factory=dict)
    _pid_jobs: dict[int, JobRef | None] = field(default_factory=dict)
    _users: dict[int, str | None] = field(default_factory=dict)
    status: tuple[AttributionStatus, ...] = ()

    def __post_init__(self) -> None:
        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                self._boot_id: str | None = f.read().strip()
        except OSError:
            self._boot_id = None

    def poll(self, t_s: float, gpus: Sequence[GpuSample]) -> list[GpuSample]:
        by_index: dict[int, list[JobRef]] = {}
        by_uuid: dict[str, list[JobRef]] = {}
        statuses = []
        if self.jobs_dir is not None:
            up, why = self._read_prolog_dir(by_index, by_uuid)
            statuses.append(AttributionStatus("slurm", up, why))
        if self.dcgm_dir is not None:
            up, why = self._read_dcgm_dir(by_index)
            statuses.append(AttributionStatus("dcgm-mapping", up, why))
        if self.kubelet is not None:
            view = self.kubelet.view
            for d in view.devices:
                kind, value = device_key(d.device_id)
                ref = pod_ref(d)
                target = (
                    by_uuid.setdefault(value, []) if kind == "uuid" else by_index.setdefault(int(value), [])
                )
                if ref not in target:
                    target.append(ref)
            statuses.append(AttributionStatus("kubernetes", view.up, view.reason))
        scheduled = self._in_use(statuses)
        kubelet_down = any(s.source == "kubernetes" and not s.up for s in statuses)
        out = []
        live_pids: set[int] = set()
        for g in gpus:
            refs = list(by_uuid.get(g.uuid, ())) if g.uuid else []
            for r in by_index.get(g.index, ()):
                if r not in refs:
                    refs.append(r)
            if not refs and self.cgroups:
                refs = self._from_cgroups(p.pid for p in g.processes)
            live_pids.update(p.pid for p in g.processes)
            if refs:
                out.append(g._replace(jobs=tuple(refs)))
            elif scheduled and g.available:
                out.append(g._replace(unattributed=_why_none(g, kubelet_down)))
            else:
                out.append(g)
        for pid in set(self._pid_jobs) - live_pids:  # processes gone: forget them
            del self._pid_jobs[pid]
        self.status = tuple(statuses)
        return out

    def _in_use(self, statuses: list[AttributionStatus]) -> bool:
        """A scheduler is in use here: the kubelet is asked, a mapping directory is set up (the
        prolog has run since boot), or dcgm's layout is configured. Only then does a GPU with no
        job get a reason (a workstation has no jobs, and says nothing about it)."""
        return (
            self.kubelet is not None
            or self.dcgm_dir is not None
            or bool(self._files)
            or (self.jobs_dir is not None and os.path.isdir(self.jobs_dir))
        )

    # -- the prolog's directory --------------------------------------------------------------------

    def _read_prolog_dir(
        self, by_index: dict[int, list[JobRef]], by_uuid: dict[str, list[JobRef]]
    ) -> tuple[bool, str | None]:
        assert self.jobs_dir is not None
        try:
            entries = {e.name: e for e in os.scandir(self.jobs_dir) if not e.name.startswith(".")}
        except FileNotFoundError:
            self._files.clear()
            return True, None  # no job has run since boot (the prolog makes it): nothing to say
        except OSError as e:
            self.problems.note("jobs:dir", f"jobs: cannot read {self.jobs_dir}: {e.strerror}")
            return False, f"cannot read {self.jobs_dir}: {e.strerror}"
        self.problems.clear("jobs:dir")
        for gone in set(self._files) - set(entries):
            del self._files[gone]
            self.problems.clear(f"jobs:file:{gone}")
        for name, entry in entries.items():
            try:
                mtime = entry.stat().st_mtime_ns
            except OSError:
                continue
            cached = self._files.get(name)
            if cached is None or cached.mtime_ns != mtime:
                cached = self._files[name] = _Cached(mtime, self._read_file(entry.path, name))
            if cached.job is not None:
                by_index.setdefault(cached.job.gpu_index, []).append(cached.job.ref)
                if cached.job.gpu_uuid:
                    by_uuid.setdefault(cached.job.gpu_uuid, []).append(cached.job.ref)
        return True, None

    def _read_file(self, path: str, name: str) -> MappedJob | None:
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_FILE_BYTES + 1)
            if len(data) > MAX_FILE_BYTES:
                raise ValueError("too large to be a job file")
            job = parse_mapping_file(name, data.decode("utf-8"), self._boot_id)
        except (OSError, UnicodeDecodeError, ValueError) as e:
            why = (
                e.strerror
                if isinstance(e, OSError)
                else ("not UTF-8 text" if isinstance(e, UnicodeDecodeError) else str(e))
            )
            self.problems.note(f"jobs:file:{name}", f"jobs: {path} skipped: {why}")
            return None
        self.problems.clear(f"jobs:file:{name}")
        return job

    # -- dcgm-exporter's layout --------------------------------------------------------------------

    def _read_dcgm_dir(self, by_index: dict[int, list[JobRef]]) -> tuple[bool, str | None]:
        assert self.dcgm_dir is not None
        try:
            entries = [e for e in os.scandir(self.dcgm_dir) if e.name.isdigit()]
        except OSError as e:
            self.problems.note("jobs:dcgm-dir", f"jobs: cannot read {self.dcgm_dir}: {e.strerror}")
            return False, f"cannot read {self.dcgm_dir}: {e.strerror}"
        self.problems.clear("jobs:dcgm-dir")
        for entry in entries:
            try:
                mtime = entry.stat().st_mtime_ns
                cached = self._dcgm.get(entry.name)
                if cached is None or cached[0] != mtime:
                    with open(entry.path, "rb") as f:
                        text = f.read(MAX_FILE_BYTES).decode("utf-8")
                    ids = tuple(ln.strip() for ln in text.splitlines() if ln.strip())
                    if any(not re.fullmatch(r"[0-9A-Za-z_.+-]{1,64}", i) for i in ids):
                        raise ValueError("not one job id per line")
                    cached = self._dcgm[entry.name] = (mtime, ids)
                    self.problems.clear(f"jobs:dcgm:{entry.name}")
            except (OSError, UnicodeDecodeError, ValueError) as e:
                self.problems.note(f"jobs:dcgm:{entry.name}", f"jobs: {entry.path} skipped: {e}")
                continue
            for job in cached[1]:
                by_index.setdefault(int(entry.name), []).append(
                    JobRef("slurm", job, None, None, "dcgm-mapping")
                )
        return True, None

    # -- the processes' cgroups --------------------------------------------------------------------

    def _from_cgroups(self, pids: Iterable[int]) -> list[JobRef]:
        refs: list[JobRef] = []
        for pid in pids:
            if pid not in self._pid_jobs:
                self._pid_jobs[pid] = self._cgroup_job(pid)
            ref = self._pid_jobs[pid]
            if ref is not None and ref not in refs:
                refs.append(ref)
        return refs

    def _cgroup_job(self, pid: int) -> JobRef | None:
        try:
            with open(f"{self.proc}/{pid}/cgroup") as f:
                text = f.read()
            found = parse_cgroup(text)
            uid = (
                found[2]
                if found is not None and found[2] is not None
                else os.stat(f"{self.proc}/{pid}").st_uid
            )
        except OSError:
            return None  # gone, or in another PID namespace
        if found is None:
            pod = parse_pod_cgroup(text)
            if pod is None:
                return None
            # a GPU that reached a pod without the device plugin: named by the pod's UID
            return JobRef("kubernetes", f"pod-uid/{pod[0]}", None, None, "cgroup", None, None, pod[1])
        return JobRef("slurm", found[0], self._user(uid), found[1], "cgroup")

    def _user(self, uid: int) -> str | None:
        if uid not in self._users:
            try:
                self._users[uid] = pwd.getpwuid(uid).pw_name
            except KeyError:
                self._users[uid] = str(uid)
        return self._users[uid]


def _why_none(g: GpuSample, kubelet_down: bool) -> str:
    """Why a GPU names no job, as a short code (docs/kubernetes.md, docs/fleet.md)."""
    if not g.processes:
        return "no-process"  # nothing runs on it: no job holds it
    if kubelet_down:
        return "kubelet-unavailable"
    return "unknown-process"  # processes no scheduler handed the GPU to, or not visible from here
