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
boot is skipped, with one log line per file (until it changes), for the first LOGGED_FILES such
files (the rest in one line with their count). Only regular files are read (a FIFO would block
the sampler, a device never end; a symlink is not followed), MAX_FILE_BYTES at most.

Reading is cheap and bounded: the directory is listed again only when it changes (or every
RESCAN_S), at most MAX_FILES job files are kept, at most MAX_READS_PER_TICK files are read in one
tick (the rest in the next ones), and a GPU names at most MAX_JOBS_PER_GPU jobs (the newest).

A job whose epilog never ran (a node that crashed, a killed epilog) would stay on its GPU beside
the next job until reboot. So a mapped job is dropped, with one log line, when it is seen to be
over: where Slurm keeps its jobs in cgroups (`/sys/fs/cgroup/system.slice/slurmstepd.scope`, or
v1's `.../slurm/uid_*/`), when its `job_<id>` cgroup is gone; and when the GPU's processes all
belong to other Slurm jobs (by their cgroups). A process's cgroup is read once (it does not change
jobs); only Slurm's own cgroup paths name a job (a user can create `.../slurm/job_777` under their
own systemd slice).
"""

from __future__ import annotations

import logging
import math
import os
import pwd
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from gpumon.core.files import read_regular
from gpumon.core.model import AttributionStatus, GpuSample, JobRef
from gpumon.core.problems import Problems

if TYPE_CHECKING:
    from gpumon.collect.sources.kubelet import KubeletClient


log = logging.getLogger("gpumon.jobs")

DEFAULT_JOBS_DIR = "/run/gpumon/jobs"
DEFAULT_CGROUP_ROOT = "/sys/fs/cgroup"
_FILE = re.compile(r"^gpu([0-9]+)(\.mig[0-9]+)?\.job([0-9][0-9_+]*)$")
"""gpu<INDEX>.job<JOBID>, or gpu<PARENT>.mig<N>.job<JOBID> for a MIG instance (named by its UUID).
A Slurm job id is digits, with `_` (an array task) or `+` (a heterogeneous job's component) at
most: the prolog and epilog refuse any other (a `.` or `..` would name another path)."""
_V2 = re.compile(r"^/system\.slice/(?:[^/]+_)?slurmstepd\.scope/job_([0-9]+)(?:/step_([0-9a-z_]+))?(?:/|$)")
"""cgroup v2: slurmstepd's own scope (`<nodename>_slurmstepd.scope` with several slurmds)."""
_POD = re.compile(
    r"kubepods[^:]*?pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
)
_CONTAINER = re.compile(r"(?:cri-containerd-|crio-|docker-|containerd-)?([0-9a-f]{64})(?:\.scope)?$")
_V1 = re.compile(r"^/slurm(?:_[^/]+)?/uid_([0-9]{1,10})/job_([0-9]+)(?:/step_([0-9a-z_]+))?(?:/|$)")
"""cgroup v1: Slurm's hierarchy at the root of a controller (`/slurm_<nodename>` with several)."""
MAX_FILE_BYTES = 4096
MAX_INDEX_DIGITS = 6
"""A GPU index is a few ASCII digits: a longer name is no GPU's."""
MAX_GPU_INDEX = 4095
"""The highest GPU index a job may name (a trace holds 4096 GPUs at most: no node has more)."""
MAX_FILES = 4096
"""Job files kept from one directory: a node runs a few jobs per GPU at most."""
MAX_READS_PER_TICK = 64
MAX_JOBS_PER_GPU = 16
LOGGED_FILES = 10
RESCAN_S = 30.0
"""The directory is listed again at least this often (a file rewritten in place), else when it changes."""
ALIVE_CHECK_S = 10.0


class MappedJob(NamedTuple):
    gpu_index: int
    gpu_uuid: str | None
    ref: JobRef
    job_id: str = ""
    """Slurm's own id of the job (an array task's too), as its cgroup names it."""
    uid: int | None = None


def parse_mapping_file(name: str, text: str, boot_id: str | None) -> MappedJob:
    """One prolog file -> the job it names. ValueError(reason) for anything else."""
    m = _FILE.match(name)
    if m is None:
        raise ValueError("not a gpumon job file name (gpu<INDEX>.job<JOBID>)")
    gpu_index, mig_file, job_in_name = m.group(1), m.group(2), m.group(3)
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
    if not job or job != job_in_name:
        raise ValueError("its job_id does not match its name")
    if values.get("gpu_index") not in (None, gpu_index):
        raise ValueError("its gpu_index does not match its name")
    uuid = values.get("gpu_uuid") or None
    if mig_file and not (uuid or "").startswith("MIG-"):
        raise ValueError("a MIG instance's file (.mig<N>) needs its gpu_uuid=MIG-...")
    if boot_id and values.get("boot_id") and values["boot_id"] != boot_id:
        raise ValueError("stale: written before this machine's last boot")
    array = values.get("array_job_id")
    task = values.get("array_task_id")
    shown = f"{array}_{task}" if array and task else job
    started: float | None = None
    if "written_unix_s" in values:
        try:
            started = float(values["written_unix_s"])
        except ValueError:
            raise ValueError("written_unix_s is not a number") from None
        if not 0 < started < 1e11:  # NaN and infinities too: they would reach the state API's JSON
            raise ValueError(f"written_unix_s is not a time: {values['written_unix_s'][:30]!r}")
    uid_text = values.get("uid", "")
    uid = _number(uid_text, 10)
    ref = JobRef(values.get("scheduler") or "slurm", shown, values.get("user") or None, None, "prolog")
    index = _gpu_index(gpu_index)
    if index is None:
        raise ValueError(f"its GPU index is not a GPU's (0 to {MAX_GPU_INDEX})")
    return MappedJob(index, uuid, ref._replace(started_unix_s=started), job, uid)


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
        m1 = _V1.match(path)
        if m1:
            return m1.group(2), m1.group(3), int(m1.group(1))
        m2 = _V2.match(path)
        if m2:
            return m2.group(1), m2.group(2), None
    return None


@dataclass(eq=False)  # state, not a value: equal only to itself
class _Cached:
    """A job file as last read: its mtime and the job it names, when that job was last checked for
    being over, and why it is."""

    mtime_ns: int
    job: MappedJob | None
    alive_checked: float = -math.inf
    over: str | None = None
    """Why the job is over (its epilog missed), once seen: then it is not named."""


@dataclass(eq=False)  # state, not a value: equal only to itself
class JobSource:
    """Maps GPUs to the jobs holding them; `poll` returns the GPUs with their `jobs` filled in."""

    problems: Problems
    jobs_dir: str | None = DEFAULT_JOBS_DIR
    dcgm_dir: str | None = None
    cgroups: bool = True
    proc: str = "/proc"
    kubelet: KubeletClient | None = None
    name: str = "jobs"
    cgroup_root: str = DEFAULT_CGROUP_ROOT
    clock: Callable[[], float] = time.monotonic
    _files: dict[str, _Cached] = field(default_factory=dict)
    _listing: tuple[int, float, list[tuple[str, str]]] | None = None
    """(directory mtime, when listed, [(name, path)] of job files) from the last listing."""
    _bad: set[str] = field(default_factory=set)
    """Files skipped as bad now (the first LOGGED_FILES are logged by name)."""
    _raw_ids: dict[JobRef, str] = field(default_factory=dict)
    """A mapped job as shown (an array task as 70_7) -> Slurm's own id of it (77)."""
    _dcgm: dict[str, tuple[tuple[int, int], tuple[str, ...] | None]] = field(default_factory=dict)
    """A dcgm mapping file's name -> ((mtime, ctime), the job ids it names, or None: a bad file)."""
    _dcgm_bad: set[str] = field(default_factory=set)
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
            # the kubelet's client: only where pods are attributed (most hosts start without it)
            from gpumon.collect.sources.kubelet import device_key, pod_ref

            view = self.kubelet.view
            for d in view.devices:
                kind, value = device_key(d.device_id)
                ref = pod_ref(d)
                if kind == "uuid":
                    target = by_uuid.setdefault(value, [])
                else:
                    index = _gpu_index(value)
                    if index is None:
                        continue  # not a GPU index (e.g. "²", a digit to str.isdigit, not to int)
                    target = by_index.setdefault(index, [])
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
            if refs and self.cgroups and g.processes:
                refs = self._drop_finished(g, refs)
            if len(refs) > MAX_JOBS_PER_GPU:
                self.problems.note(
                    f"jobs:many:{g.index}",
                    f"jobs: GPU {g.index} is named by {len(refs)} jobs; only the newest {MAX_JOBS_PER_GPU} "
                    "are shown (are epilogs missing?)",
                )
                refs = sorted(refs, key=lambda r: -(r.started_unix_s or 0.0))[:MAX_JOBS_PER_GPU]
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
            entries = self._list_jobs_dir(self.jobs_dir)
        except FileNotFoundError:
            self._files.clear()
            self._listing = None
            return True, None  # no job has run since boot (the prolog makes it): nothing to say
        except OSError as e:
            self.problems.note("jobs:dir", f"jobs: cannot read {self.jobs_dir}: {e.strerror}")
            return False, f"cannot read {self.jobs_dir}: {e.strerror}"
        self.problems.clear("jobs:dir")
        names = {name for name, _ in entries}
        for gone in set(self._files) - names:
            del self._files[gone]
            self._forget_bad(gone)
        reads = 0
        now = self.clock()
        self._raw_ids = {}
        for name, path in entries:
            cached = self._files.get(name)
            try:
                mtime = os.stat(path, follow_symlinks=False).st_mtime_ns
            except OSError:
                continue
            if cached is None or cached.mtime_ns != mtime:
                if reads >= MAX_READS_PER_TICK:
                    continue  # read in the next ticks: a tick's cost stays bounded
                reads += 1
                cached = self._files[name] = _Cached(mtime, self._read_file(path, name))
            job = cached.job
            if job is None:
                continue
            if now - cached.alive_checked >= ALIVE_CHECK_S and cached.over is None:
                cached.alive_checked = now
                cached.over = self._over(job)
                if cached.over is not None:
                    self.problems.note(
                        f"jobs:over:{name}",
                        f"jobs: {path}: job {job.job_id} is over ({cached.over}) but its file is still "
                        "here (a missed epilog?): not named",
                    )
            if cached.over is not None:
                continue
            self._raw_ids[job.ref] = job.job_id
            if not (job.gpu_uuid or "").startswith("MIG-"):  # an instance: not its parent, not its siblings
                by_index.setdefault(job.gpu_index, []).append(job.ref)
            if job.gpu_uuid:
                by_uuid.setdefault(job.gpu_uuid, []).append(job.ref)
        return True, None

    def _list_jobs_dir(self, directory: str) -> list[tuple[str, str]]:
        """(name, path) of the job files, listed again when the directory changed or every
        RESCAN_S; at most MAX_FILES (the rest counted, said once)."""
        st = os.stat(directory)
        now = self.clock()
        if self._listing is not None:
            mtime, when, entries = self._listing
            if mtime == st.st_mtime_ns and now - when < RESCAN_S:
                return entries
        found: list[tuple[str, str]] = []
        total = 0
        seen: set[str] = set()
        with os.scandir(directory) as it:
            for e in it:
                seen.add(e.name)
                if e.name.startswith(".") or not _FILE.match(e.name):
                    if not e.name.startswith("."):
                        self._skip(e.name, e.path, "not a gpumon job file name (gpu<INDEX>.job<JOBID>)")
                    continue
                total += 1
                if len(found) < MAX_FILES:
                    found.append((e.name, e.path))
        for gone in self._bad - seen:
            self._forget_bad(gone)
        if total > MAX_FILES:
            self.problems.note(
                "jobs:too-many",
                f"jobs: {directory} holds {total} job files, more than {MAX_FILES}: only {MAX_FILES} "
                "are read (are epilogs missing?)",
            )
        else:
            self.problems.clear("jobs:too-many")
        self._listing = (st.st_mtime_ns, now, found)
        return found

    def _read_file(self, path: str, name: str) -> MappedJob | None:
        try:
            # only a regular file (a FIFO would block this thread), never through a symlink
            data = read_regular(path, MAX_FILE_BYTES, follow_symlinks=False)
            if len(data) > MAX_FILE_BYTES:
                raise ValueError("too large to be a job file")
            job = parse_mapping_file(name, data.decode("utf-8"), self._boot_id)
        except (OSError, UnicodeDecodeError, ValueError) as e:
            why = (
                e.strerror
                if isinstance(e, OSError)
                else ("not UTF-8 text" if isinstance(e, UnicodeDecodeError) else str(e))
            )
            self._skip(name, path, why)
            return None
        self._forget_bad(name)
        return job

    def _skip(self, name: str, path: str, why: str | None) -> None:
        """A bad file: logged by name for the first LOGGED_FILES, then counted in one line."""
        if name not in self._bad and len(self._bad) >= LOGGED_FILES:
            self.problems.note(
                "jobs:files",
                f"jobs: more than {LOGGED_FILES} files skipped in {self.jobs_dir}; not logged one by one",
            )
            return
        self._bad.add(name)
        self.problems.note(f"jobs:file:{name}", f"jobs: {path} skipped: {why}")

    def _forget_bad(self, name: str) -> None:
        if name in self._bad:
            self._bad.discard(name)
            self.problems.clear(f"jobs:file:{name}")
        self.problems.clear(f"jobs:over:{name}")
        if len(self._bad) < LOGGED_FILES:
            self.problems.clear("jobs:files")

    def _over(self, job: MappedJob) -> str | None:
        """Why the mapped job is known to be over, from Slurm's cgroups; None when it runs or
        cannot be told (Slurm without cgroups)."""
        v2 = os.path.join(self.cgroup_root, "system.slice")
        try:
            scopes = [e.path for e in os.scandir(v2) if e.name.endswith("slurmstepd.scope")]
        except OSError:
            scopes = []
        if scopes:
            if any(os.path.isdir(os.path.join(sc, f"job_{job.job_id}")) for sc in scopes):
                return None
            return "no Slurm cgroup of it"
        for controller in ("freezer", "cpuset", "memory"):
            root = os.path.join(self.cgroup_root, controller, "slurm")
            if os.path.isdir(root):
                uids = [f"uid_{job.uid}"] if job.uid is not None else _listdir(root)
                if any(os.path.isdir(os.path.join(root, u, f"job_{job.job_id}")) for u in uids):
                    return None
                return "no Slurm cgroup of it"
        return None

    def _drop_finished(self, g: GpuSample, refs: list[JobRef]) -> list[JobRef]:
        """A prolog's job on a GPU whose processes all belong to other Slurm jobs is over."""
        running = {r.job_id for r in self._from_cgroups(p.pid for p in g.processes) if r.scheduler == "slurm"}
        if not running:
            return refs  # nothing to tell by (no process in a Slurm cgroup seen from here)
        kept = []
        for r in refs:
            mapped = self._raw_ids.get(r, r.job_id)
            if r.via == "prolog" and mapped not in running:
                self.problems.note(
                    f"jobs:over:gpu{g.index}.job{mapped}",
                    f"jobs: GPU {g.index}: job {mapped} is over (the GPU's processes are job "
                    f"{', '.join(sorted(running))}'s) but its file is still here (a missed epilog?): "
                    "not named",
                )
                continue
            kept.append(r)
        return kept

    # -- dcgm-exporter's layout --------------------------------------------------------------------

    def _read_dcgm_dir(self, by_index: dict[int, list[JobRef]]) -> tuple[bool, str | None]:
        """Files named by GPU index (ASCII digits only), one job id per line: each read on its
        own (a bad one is skipped, said until it is good or gone), regular files only, never
        through a symlink, MAX_FILE_BYTES at most, at most MAX_READS_PER_TICK per tick."""
        assert self.dcgm_dir is not None
        try:
            with os.scandir(self.dcgm_dir) as it:
                entries = [(e, i) for e in it if (i := _gpu_index(e.name)) is not None]
        except OSError as e:
            self.problems.note("jobs:dcgm-dir", f"jobs: cannot read {self.dcgm_dir}: {e.strerror}")
            return False, f"cannot read {self.dcgm_dir}: {e.strerror}"
        self.problems.clear("jobs:dcgm-dir")
        names = {e.name for e, _ in entries}
        for gone in set(self._dcgm) - names:
            del self._dcgm[gone]
        for gone in self._dcgm_bad - names:
            self._forget_dcgm_bad(gone)
        reads = 0
        for entry, index in entries:
            cached = self._dcgm.get(entry.name)
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # removed since it was listed
            stamp = (st.st_mtime_ns, st.st_ctime_ns)  # ctime: a chmod'ed file is read again
            if (cached is None or cached[0] != stamp) and reads < MAX_READS_PER_TICK:
                reads += 1
                cached = self._dcgm[entry.name] = (stamp, self._read_dcgm_file(entry.name, entry.path))
            if cached is None:
                continue  # read in the next ticks: a tick's cost stays bounded
            # (a changed file beyond the tick's reads keeps its jobs as last read until its turn)
            for job in cached[1] or ():
                by_index.setdefault(index, []).append(JobRef("slurm", job, None, None, "dcgm-mapping"))
        return True, None

    def _read_dcgm_file(self, name: str, path: str) -> tuple[str, ...] | None:
        """The job ids of one dcgm mapping file; None (said, until it is good or gone) when bad."""
        try:
            # a regular file only (a FIFO would block the sampler), never through a symlink
            data = read_regular(path, MAX_FILE_BYTES, follow_symlinks=False)
            if len(data) > MAX_FILE_BYTES:
                raise ValueError("too large to be a job mapping file")
            ids = tuple(ln.strip() for ln in data.decode("utf-8").splitlines() if ln.strip())
            if any(not re.fullmatch(r"[0-9A-Za-z_.+-]{1,64}", i) for i in ids):
                raise ValueError("not one job id per line")
        except (OSError, UnicodeDecodeError, ValueError) as e:
            why = (
                e.strerror
                if isinstance(e, OSError)
                else ("not UTF-8 text" if isinstance(e, UnicodeDecodeError) else str(e))
            )
            if name in self._dcgm_bad or len(self._dcgm_bad) < LOGGED_FILES:
                self._dcgm_bad.add(name)
                self.problems.note(f"jobs:dcgm:{name}", f"jobs: {path} skipped: {why}")
            else:
                self.problems.note(
                    "jobs:dcgm-files",
                    f"jobs: more than {LOGGED_FILES} files skipped in {self.dcgm_dir}; not logged one by one",
                )
            return None
        self._forget_dcgm_bad(name)
        return ids

    def _forget_dcgm_bad(self, name: str) -> None:
        if name in self._dcgm_bad:
            self._dcgm_bad.discard(name)
            self.problems.clear(f"jobs:dcgm:{name}")
        if len(self._dcgm_bad) < LOGGED_FILES:
            self.problems.clear("jobs:dcgm-files")

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


def _number(text: str, max_digits: int) -> int | None:
    """`text` as a number when it is 1 to `max_digits` ASCII digits, else None. str.isdigit says
    yes to "²" (which int() refuses) and int() reads "٣" as 3: neither names a GPU or a user."""
    if not (text.isascii() and text.isdigit()) or len(text) > max_digits:
        return None
    return int(text)


def _gpu_index(text: str) -> int | None:
    """`text` as a GPU index (ASCII digits, 0 to MAX_GPU_INDEX), else None."""
    index = _number(text, MAX_INDEX_DIGITS)
    return index if index is not None and index <= MAX_GPU_INDEX else None


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _why_none(g: GpuSample, kubelet_down: bool) -> str:
    """Why a GPU names no job, as a short code (docs/kubernetes.md, docs/fleet.md)."""
    if not g.processes:
        return "no-process"  # nothing runs on it: no job holds it
    if kubelet_down:
        return "kubelet-unavailable"
    return "unknown-process"  # processes no scheduler handed the GPU to, or not visible from here
