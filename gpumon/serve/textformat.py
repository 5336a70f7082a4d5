"""Metric families and their text: the Prometheus text format (0.0.4 and 1.0.0) and OpenMetrics
1.0.0, chosen by the scraper's Accept header.

Written here rather than taken from prometheus_client, which the daemon used until 2026-12-02:
importing it (it brings http.server, urllib, wsgiref and email) was ~20 ms of the ~190 ms from a
start to the first answer (issue 29), and its content negotiation raised on a scraper's
`Accept: application/openmetrics-text; version=abc` (an empty reply and a traceback in the log at
every scrape). What gpumon needs is small: gauges and counters, no timestamps, exemplars or
created times, names that are all legacy-valid. For every Accept header the library answers,
the bytes and the content type are the library's (prometheus_client 0.26, tests/test_textformat.py
holds the two side by side, with the library as the oracle); where the library raises (a version
that is not a number), this answers as if the entry were absent.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

UNDERSCORES = "underscores"
ALLOW_UTF8 = "allow-utf-8"
DOTS = "dots"
VALUES = "values"
ESCAPINGS = (ALLOW_UTF8, UNDERSCORES, DOTS, VALUES)

TEXT_0_0_4 = "text/plain; version=0.0.4; charset=utf-8"
TEXT_1_0_0 = "text/plain; version=1.0.0; charset=utf-8"
OPENMETRICS_1_0_0 = "application/openmetrics-text; version=1.0.0; charset=utf-8"

_LEGACY_METRIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LEGACY_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


class Family:
    """One metric: its name, help, type, label names and samples (label values, value)."""

    __slots__ = ("documentation", "label_names", "name", "samples", "type")

    def __init__(
        self,
        kind: str,
        name: str,
        documentation: str,
        labels: Sequence[str] | None = None,
        value: float | None = None,
    ) -> None:
        if kind not in ("gauge", "counter"):
            raise ValueError(f"{name}: only gauges and counters are written here, not {kind!r}")
        if kind == "counter" and name.endswith("_total"):
            name = name[: -len("_total")]  # a counter's samples carry the suffix
        if not _LEGACY_METRIC.fullmatch(name):
            raise ValueError(f"invalid metric name {name!r}")
        names = tuple(labels or ())
        if len(set(names)) != len(names):  # Prometheus would refuse the whole scrape
            raise ValueError(f"{name}: a label name twice in {names}")
        for label in names:
            if not _LEGACY_LABEL.fullmatch(label) or label.startswith("__"):
                raise ValueError(f"{name}: invalid label name {label!r}")
        self.name = name
        self.documentation = documentation
        self.type = kind
        self.label_names = names
        self.samples: list[tuple[tuple[str, ...], float]] = []
        if value is not None:
            if names:
                raise ValueError(f"{name}: a value with labels: give it with add_metric")
            self.samples.append(((), value))

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        if len(labels) != len(self.label_names):
            raise ValueError(f"{self.name}: {len(labels)} label values for {len(self.label_names)} labels")
        self.samples.append((tuple(labels), value))

    @property
    def sample_name(self) -> str:
        return self.name + "_total" if self.type == "counter" else self.name


def gauge(
    name: str, documentation: str, labels: Sequence[str] | None = None, value: float | None = None
) -> Family:
    return Family("gauge", name, documentation, labels, value)


def counter(
    name: str, documentation: str, labels: Sequence[str] | None = None, value: float | None = None
) -> Family:
    return Family("counter", name, documentation, labels, value)


# -- numbers and names ---------------------------------------------------------------------------


def float_text(value: float) -> str:
    """A number as the exposition formats write it (Go's way: 1.0, 1e+06, +Inf, NaN)."""
    d = float(value)
    if d == float("inf"):
        return "+Inf"
    if d == float("-inf"):
        return "-Inf"
    if d != d:
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:  # Go switches to exponents sooner than Python
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


def _quote(text: str) -> str:
    """A label value (and OpenMetrics help): backslash, newline and double quote escaped."""
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _legacy_rune(c: str, i: int) -> bool:
    return "a" <= c <= "z" or "A" <= c <= "Z" or c == "_" or ("0" <= c <= "9" and i > 0)


def _escape_name(name: str, escaping: str, metric: bool) -> str:
    """A (legacy-valid) metric or label name under the scraper's escaping scheme."""
    if escaping == DOTS:
        out = []
        for i, c in enumerate(name):
            if c == "_":
                out.append("__")
            elif c == "." or not (_legacy_rune(c, i) or (metric and c == ":")):
                out.append("_dot_" if c == "." else "__")
            else:
                out.append(c)
        return "".join(out)
    return name  # legacy-valid names are the same under the other schemes


def _escape_sample_name(name: str, escaping: str) -> str:
    """OpenMetrics writes a sample's name escaped as a label name would be (so `values` marks
    it with U__, and `underscores` turns a colon into one)."""
    if escaping == ALLOW_UTF8:
        return _quote(name)
    if escaping == DOTS:
        return _escape_name(name, DOTS, metric=False)
    out = []
    for i, c in enumerate(name):
        if escaping == VALUES and c == "_":
            out.append("__")
        elif _legacy_rune(c, i):
            out.append(c)
        elif escaping == VALUES:
            out.append(f"_{ord(c):x}_")
        else:
            out.append("_")
    return ("U__" if escaping == VALUES else "") + "".join(out)


def _label_parts(fam: Family, escaping: str) -> tuple[list[int], list[str]]:
    """The label order the formats use (sorted by name) and each name as written."""
    order = sorted(range(len(fam.label_names)), key=fam.label_names.__getitem__)
    return order, [_escape_name(fam.label_names[i], escaping, metric=False) for i in order]


def _sample_lines(fam: Family, name: str, escaping: str, out: list[str]) -> None:
    order, written = _label_parts(fam, escaping)
    for values, value in fam.samples:
        if order:
            labels = ",".join(f'{n}="{_quote(values[i])}"' for n, i in zip(written, order, strict=True))
            out.append(f"{name}{{{labels}}} {float_text(value)}\n")
        else:
            out.append(f"{name} {float_text(value)}\n")


# -- the two formats -----------------------------------------------------------------------------


def render_text(families: Iterable[Family], escaping: str = UNDERSCORES) -> bytes:
    """The Prometheus text format: a counter's help and type name carry `_total`."""
    out: list[str] = []
    for fam in families:
        name = _escape_name(fam.sample_name, escaping, metric=True)
        doc = fam.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {fam.type}\n")
        _sample_lines(fam, name, escaping, out)
    return "".join(out).encode("utf-8")


def render_openmetrics(families: Iterable[Family], escaping: str = UNDERSCORES) -> bytes:
    """OpenMetrics 1.0.0: a counter's family name without `_total`, its samples with; `# EOF`."""
    out: list[str] = []
    for fam in families:
        name = _escape_name(fam.name, escaping, metric=True)
        out.append(f"# HELP {name} {_quote(fam.documentation)}\n# TYPE {name} {fam.type}\n")
        _sample_lines(fam, _escape_sample_name(fam.sample_name, escaping), escaping, out)
    out.append("# EOF\n")
    return "".join(out).encode("utf-8")


class Format(NamedTuple):
    """What the text depends on (the content type may echo more: the scraper's version): at most
    eight, so a cache keyed by it stays small whatever scrapers send."""

    openmetrics: bool
    escaping: str

    def render(self, families: Iterable[Family]) -> bytes:
        return (render_openmetrics if self.openmetrics else render_text)(families, self.escaping)


def negotiate(accept: str | None) -> tuple[Format, str]:
    """The format a scraper asked for, and its content type: the first entry of the Accept header
    that names OpenMetrics (any version from 1.0.0, or none) or the text format at 1.0.0 or later,
    with its escaping scheme (underscores unless it names another); else the text format 0.0.4.
    Quality values are not weighed (prometheus_client does not either: Prometheus lists its
    preferences in order). OpenMetrics' content type repeats the scraper's version, as the library
    does; a version that a response header cannot carry as it came (anything but visible ASCII:
    the library's answer then failed to be sent) passes the entry over."""
    for entry in (accept or "").split(","):
        toks = entry.split(";")
        kind = toks[0].strip()
        if kind not in ("application/openmetrics-text", "text/plain"):
            continue
        version, escaping = _parameters(toks)
        if kind == "application/openmetrics-text":
            if not version:
                return Format(True, UNDERSCORES), OPENMETRICS_1_0_0
            if _at_least_1(version) and all("!" <= c <= "~" for c in version):
                return Format(True, escaping), (
                    f"application/openmetrics-text; version={version}; charset=utf-8; escaping={escaping}"
                )
        elif version and _at_least_1(version):
            return Format(False, escaping), f"{TEXT_1_0_0}; escaping={escaping}"
    return Format(False, UNDERSCORES), TEXT_0_0_4


def _parameters(toks: list[str]) -> tuple[str, str]:
    """The entry's first `version=` and first `escaping=` (an unknown scheme: underscores)."""
    version, escaping = None, None
    for tok in toks:
        if "=" not in tok:
            continue
        key, value = tok.strip().split("=", 1)
        if key == "version" and version is None:
            version = value
        elif key == "escaping" and escaping is None:
            escaping = value if value in ESCAPINGS else UNDERSCORES
    return version or "", escaping or UNDERSCORES


def _at_least_1(version: str) -> bool:
    """version >= 1.0.0, compared part by part as numbers; a part that is not a number where
    the comparison reaches it makes the version unusable (prometheus_client raises there)."""
    parts: list[int | str] = []
    for part in version.split("."):
        try:
            parts.append(int(part))
        except ValueError:
            parts.append(part)
    for mine, least in zip(parts, (1, 0, 0), strict=False):
        if not isinstance(mine, int):
            return False
        if mine != least:
            return mine > least
    return len(parts) >= 3
