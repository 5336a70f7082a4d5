### dstat_gpu: per-GPU utilization, memory and gpumon's starvation verdict, for `dstat --gpu`
### and (installed as dool_gpu.py) `dool --gpu`. Standard library only: Debian's dstat runs it under
### the system python3, where gpumon's virtual environment is not importable.
###
### Data, in order of preference:
###   1. the gpumon daemon's state API ($GPUMON_URL, default http://127.0.0.1:9877): utilization,
###      memory and the detector's verdict;
###   2. NVML straight through ctypes (libnvidia-ml.so.1): utilization and memory, state "-";
###   3. neither: one line saying what to start or install, and dstat exits 8, also when other
###      columns were asked for (`dstat -c --gpu`): asked for GPUs, it never runs without them.
### A daemon that refuses the credentials (HTTP 401 or 403) answered: one line saying so and how to
### give them, and exit 8, not NVML's numbers without the verdict the user asked the daemon for.
### A state that is not gpumon's (a list, wrong types, NaN) counts as no answer: never a traceback.
###
### Columns per GPU: util (%), mem (% used), state (on screen and in --output CSV alike, as
### pcp-dstat shows them):
###   ok  healthy    STcpu STio SThst  starved (cause: CPU, storage, host)    stall  stalled
###   sync  sync-stall    under  underutilized    small  kernels too small (GPM)    idle  no job
###   ?  unknown    -  no verdict
### A MIG instance has a column of its own: gpu1m2 is GPU 1's GPU instance 2.
### Starved, stalled and sync-stall GPUs are shown in white on red.
###
### Also repairs Debian dstat 0.7.4's `--output file.csv` crash (NameError: types) for the run.
###
### The file is exec'd inside dstat's main(): top-level names are not visible in methods unless
### declared global, hence the `global` lines.

global types, _json, _gpumon_state_codes, _gpumon_alarm_states, _gpumon_column, _gpumon_gpus, _gpumon_ratio
global _gpumon_shown, _GPUMON_MAX_COLUMNS, _GPUMON_MAX_INDEX

import json as _json  # noqa: E402 - plugins are executed, not imported


class types:  # noqa: N801 - the name dstat's showcsv looks up
    """dstat 0.7.4 on Python 3 calls types.ListType in showcsv; give it what it means."""

    ListType = list
    TupleType = tuple
    StringType = str


_gpumon_state_codes = {
    "healthy": "ok", "starved-cpu": "STcpu", "starved-io": "STio", "starved-host": "SThst",
    "stalled": "stall", "sync-stall": "sync", "underutilized": "under",
    "underutilized-small-kernels": "small", "idle": "idle", "unknown": "?", "starting": "start",
    "mig": "mig",
}
_gpumon_alarm_states = ("starved", "stalled", "sync-stall")
_GPUMON_MAX_COLUMNS = 256
"""GPUs and MIG instances shown: a 16-GPU node with every GPU split in 7 has 128. A daemon naming
100,000 had dstat write megabytes a line, for seconds a line."""
_GPUMON_MAX_INDEX = 99999

try:
    _gpumon_base = dstat  # noqa: F821 - provided by dstat
except NameError:
    _gpumon_base = dool  # noqa: F821 - provided by dool


class dstat_plugin(_gpumon_base):  # noqa: N801 - the name dstat looks for
    def __init__(self):
        self.name = ["gpu"]
        self.nick = ("util", "mem", "state")
        self.vars = ["gpu"]
        self.type = "s"
        self.width = 5
        self.scale = 0
        self.mode = None
        self.url = None
        self.lib = None
        self.handles = []
        self.refused = None
        """The daemon's HTTP status when it refused the credentials (401, 403), else None."""
        self.sent_credentials = False

    # -- where the numbers come from -------------------------------------------------------------

    def check(self):
        import os
        import sys

        self.url = os.environ.get("GPUMON_URL", "http://127.0.0.1:9877").rstrip("/")
        gpus = _gpumon_gpus(self._daemon_state())
        if self.refused is not None:
            # it answered: "did not answer" would send the user to start a running daemon
            sys.stderr.write(
                "%s: the gpumon daemon at %s refused %s (HTTP %d): give USER:PASSWORD as "
                "GPUMON_URL=http://USER:PASSWORD@HOST:PORT or GPUMON_BASIC_AUTH=USER:PASSWORD "
                "(the daemon's web config file holds its users)\n"
                % (
                    os.path.basename(getattr(self, "filename", "dstat_gpu")).split(".")[0],
                    _gpumon_shown(self.url),
                    "the credentials given" if self.sent_credentials else "access without credentials",
                    self.refused,
                )
            )
            sys.stderr.flush()
            os._exit(8)
        if gpus is not None:
            self.mode = "daemon"
            columns = [_gpumon_column(g) for g in gpus]
        else:
            columns = self._nvml_open()
            if columns is None:
                # dstat would carry on without the GPU columns (exit 0) when others were asked
                # for: the user asked for GPUs, so say what to do and end as dstat ends on a
                # plugin that cannot load (8)
                sys.stderr.write(
                    "%s: no GPU data: start the gpumon daemon (gpumon serve; it did not answer at %s, "
                    "set GPUMON_URL to change that) or install the NVIDIA driver (libnvidia-ml.so.1)\n"
                    % (os.path.basename(getattr(self, "filename", "dstat_gpu")).split(".")[0],
                       _gpumon_shown(self.url))
                )
                sys.stderr.flush()
                os._exit(8)
            self.mode = "nvml"
        if not columns:
            # raised, dstat said "failed to load" and ran on without GPU columns, exit 0: asked for
            # GPUs, it ends as above
            sys.stderr.write(
                "%s: no GPUs: %s\n"
                % (
                    os.path.basename(getattr(self, "filename", "dstat_gpu")).split(".")[0],
                    "the gpumon daemon at %s lists none it can show" % _gpumon_shown(self.url)
                    if self.mode == "daemon"
                    else "NVML finds none",
                )
            )
            sys.stderr.flush()
            os._exit(8)
        self.vars = ["gpu%s" % c for c in columns]
        self.name = list(self.vars)
        return True

    def _daemon_state(self):
        """GET /api/v1/state within one second in all: a server that trickles its answer a byte at
        a time is given up on, as one that does not answer (a timeout per read would not).
        Credentials in the URL (http://USER:PASSWORD@host), else $GPUMON_BASIC_AUTH, go in an
        Authorization header, never in the Host header (which servers and proxies log)."""
        import base64
        import os
        import socket
        import time
        from urllib.parse import unquote, urlsplit

        deadline = time.monotonic() + 1.0
        self.refused = None
        try:
            url = urlsplit(self.url)
            if url.scheme not in ("http", "https"):
                return None
            host, port = url.hostname or "127.0.0.1", url.port or (443 if url.scheme == "https" else 80)
            headers = "Host: %s\r\n" % (("[%s]" % host if ":" in host else host) + (
                ":%d" % url.port if url.port else ""))
            if url.username is not None:
                creds = unquote(url.username) + ":" + unquote(url.password or "")
            else:
                creds = os.environ.get("GPUMON_BASIC_AUTH") or ""
            self.sent_credentials = bool(creds)
            if creds:
                raw = creds.encode("utf-8", "surrogateescape")  # (an environment's bytes, as given)
                headers += "Authorization: Basic %s\r\n" % base64.b64encode(raw).decode()
            request = "GET %s/api/v1/state HTTP/1.0\r\n%sConnection: close\r\n\r\n" % (
                url.path.rstrip("/"), headers)
            sock = socket.create_connection((host, port), timeout=1.0)
            if url.scheme == "https":
                import ssl

                # (the handshake's timeout is one for the whole handshake, as Python's ssl applies it)
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
            data = b""
            with sock:
                sock.sendall(request.encode("utf-8", "surrogateescape"))
                while len(data) < 16 * 1024 * 1024:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    sock.settimeout(left)
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            status = head.split(b" ", 2)[1:2] if head.startswith(b"HTTP/1.") else []
            if status in ([b"401"], [b"403"]):
                self.refused = int(status[0])
                return None
            if status != [b"200"]:
                return None
            return _json.loads(body.decode())
        except Exception:
            return None

    def _nvml_open(self):
        import ctypes

        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError:
            return None
        count = ctypes.c_uint(0)
        init = getattr(lib, "nvmlInit_v2", None) or getattr(lib, "nvmlInit", None)
        if init is None or init() != 0 or lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return None
        self.lib = lib
        self.handles = []
        for i in range(count.value):
            h = ctypes.c_void_p()
            self.handles.append(h if lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) == 0 else None)
        return list(range(count.value))

    def _nvml_read(self, handle):
        import ctypes

        class Utilization(ctypes.Structure):
            _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]

        class MemoryV2(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong),
                        ("reserved", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                        ("used", ctypes.c_ulonglong)]

        if handle is None:
            return -1, -1
        u, m = Utilization(), MemoryV2(version=0x02000028)
        util = u.gpu if self.lib.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(u)) == 0 else -1
        ok = self.lib.nvmlDeviceGetMemoryInfo_v2(handle, ctypes.byref(m)) == 0 and m.total
        return util, (100.0 * m.used / m.total if ok else -1)

    def extract(self):
        if self.mode == "daemon":
            by_name = {"gpu%s" % _gpumon_column(g): g for g in _gpumon_gpus(self._daemon_state()) or []}
            for name in self.vars:
                g = by_name.get(name)
                if g is None or not g["available"]:
                    self.val[name] = [-1, -1, "-" if g is None else "lost"]
                    continue
                util = g["util_ratio"]
                if util is None:  # a MIG instance: GPM's activity is all NVML gives
                    util = g["gpm_ratio"]
                mem = g["mem_used_ratio"]
                self.val[name] = [
                    -1 if util is None else 100.0 * util,
                    -1 if mem is None else 100.0 * mem,
                    g["label"],
                ]
        else:
            for name, handle in zip(self.vars, self.handles):
                util, mem = self._nvml_read(handle)
                self.val[name] = [util, mem, "-"]

    # -- what is shown ---------------------------------------------------------------------------

    def show(self):
        parts = []
        for name in self.vars:
            util, mem, label = self.val.get(name, [-1, -1, "-"])
            code = _gpumon_state_codes.get(label, label)[: self.width]
            text = code.ljust(self.width)
            if label.split("-")[0] in _gpumon_alarm_states or label == "sync-stall":
                text = theme["error"] + text + theme["default"]  # noqa: F821 - dstat's colours
            parts.append(cprint(util, "p", self.width, 34) + " " + cprint(mem, "p", self.width, 34)  # noqa: F821
                         + " " + text)
        return (theme["frame"] + char["colon"]).join(parts)  # noqa: F821

    def showcsv(self):
        cells = []
        for name in self.vars:
            util, mem, label = self.val.get(name, [-1, -1, "-"])
            # as pcp-dstat writes them: whole percents, the state as its short code
            cells.append("%.0f" % util if util >= 0 else "")
            cells.append("%.0f" % mem if mem >= 0 else "")
            cells.append(_gpumon_state_codes.get(label, label))
        return char["sep"].join(cells)  # noqa: F821


dool_plugin = dstat_plugin


def _gpumon_ratio(value):
    """A ratio from the state API, or None: numbers only (not bool), finite, within [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 0.0 <= value <= 1.0 else None


def _gpumon_gpus(state):
    """The GPUs of a gpumon state document, each checked and reduced to what the columns show; None
    when the document is not a ready gpumon state (a list, a string, no GPU list). A GPU entry
    that is not one (no integer index) is left out; a label is kept only if it is a short word."""
    if not isinstance(state, dict) or state.get("ready") is not True or not isinstance(state.get("gpus"), list):
        return None
    gpus, seen = [], set()
    for g in state["gpus"]:
        if len(gpus) >= _GPUMON_MAX_COLUMNS:
            break
        if not isinstance(g, dict):
            continue
        index, mig = g.get("index"), g.get("mig")
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index <= _GPUMON_MAX_INDEX:
            continue
        if mig is not None and (
                isinstance(mig, bool) or not isinstance(mig, int) or not 0 <= mig <= _GPUMON_MAX_INDEX):
            continue
        if (index, mig) in seen:
            continue  # a column each: the first
        seen.add((index, mig))
        label = g.get("label")
        if not isinstance(label, str) or not label or len(label) > 40 or not all(
                c.isalnum() or c in "-_?" for c in label) or not label.isascii():
            label = "unknown"
        gpm = g.get("gpm")
        gpus.append({
            "index": index, "mig": mig, "available": g.get("available") is True, "label": label,
            "util_ratio": _gpumon_ratio(g.get("util_ratio")),
            "mem_used_ratio": _gpumon_ratio(g.get("mem_used_ratio")),
            "gpm_ratio": _gpumon_ratio(gpm.get("graphics_ratio")) if isinstance(gpm, dict) else None,
        })
    return gpus


def _gpumon_shown(url):
    """The URL as the error line shows it: no password (what stands before an @ hidden), no
    control characters, 200 characters at most."""
    scheme, sep, rest = url.partition("//")
    authority, slash, path = rest.partition("/")
    if sep and "@" in authority:
        url = "%s//***@%s%s%s" % (scheme, authority.rpartition("@")[2], slash, path)
    shown = "".join("?" if ord(c) < 32 or 127 <= ord(c) < 160 else c for c in url[:200])
    return shown + ("..." if len(url) > 200 else "")


def _gpumon_column(g):
    """A GPU's column: its index; a MIG instance's, PARENTmID (`gpu1m2`: GPU 1's instance 2)."""
    mig = g.get("mig")
    return "%d" % g["index"] if mig is None else "%dm%d" % (g["index"], mig)
