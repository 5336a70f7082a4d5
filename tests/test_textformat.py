"""gpumon writes its exposition itself (gpumon.serve.textformat); prometheus_client, which wrote
it before, is the oracle: for the same families and the same Accept header, the same bytes and
the same content type. Where the library raises on a header, gpumon still answers."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from gpumon.serve.metrics import families
from gpumon.serve.textformat import TEXT_0_0_4, Family, counter, float_text, gauge, negotiate

from .test_docs import a_hopper_snapshot
from .test_serve import simulated_daemon

ACCEPTS = [
    "",
    "*/*",
    "text/plain",
    "text/plain; version=0.0.4",
    "text/plain;version=1.0.0",
    "text/plain; version=1.0.0; escaping=allow-utf-8",
    "text/plain; version=1.0.0; escaping=underscores",
    "text/plain; version=1.0.0; escaping=dots",
    "text/plain; version=1.0.0; escaping=values",
    "text/plain; version=1.0.0; escaping=bogus",
    "text/plain; version=2",
    "text/plain; version=1.0",
    "application/openmetrics-text",
    "application/openmetrics-text; version=1.0.0",
    "application/openmetrics-text; version=0.0.1",
    "application/openmetrics-text; version=0.0.1, text/plain; version=1.0.0; escaping=dots",
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8",
    "application/openmetrics-text;version=1.0.0;escaping=dots",
    "application/openmetrics-text;version=1.0.0;escaping=values",
    "application/openmetrics-text;version=2.0.0;escaping=values",
    "application/openmetrics-text;version=2.x",
    "application/openmetrics-text; version=;version=1.0.0",
    "application/openmetrics-text; escaping=dots; escaping=values; version=1.0.0",
    "application/openmetrics-text; version = 1.0.0",
    " application/openmetrics-text ; version=1.0.0 ",
    # Prometheus 3's default, then Prometheus 2's
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
    "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,"
    "text/plain;version=0.0.4;q=0.2,*/*;q=0.1",
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
]
RAISES_IN_THE_LIBRARY = [
    "application/openmetrics-text; version=abc",
    "text/plain; version=1.x",
    "application/openmetrics-text; version=1.0.x, text/plain; version=1.0.0; escaping=dots",
]


def _library_family(fam: Family) -> Metric:
    """The same family as prometheus_client's classes make it (what the daemon used to build)."""
    make = GaugeMetricFamily if fam.type == "gauge" else CounterMetricFamily
    if not fam.label_names:
        if not fam.samples:
            return make(fam.name, fam.documentation, labels=[])
        (_, value), *more = fam.samples
        assert not more
        return make(fam.name, fam.documentation, value=value)
    m = make(fam.name, fam.documentation, labels=list(fam.label_names))
    for values, value in fam.samples:
        m.add_metric(list(values), value)
    return m


class _Families:
    def __init__(self, fams: list[Family]) -> None:
        self.fams = fams

    def collect(self) -> Iterator[Metric]:
        return (_library_family(f) for f in self.fams)


def hostile_families() -> list[Family]:
    """What a job's labels can bring (quotes, backslashes, newlines, any Unicode) and every kind
    of number, beside colons in names and help that needs escaping."""
    odd = ["", 'a"b', "back\\slash", "new\nline", "\\n", "end\\", "ünïcødé ✓", "tab\there", '{x="y"}', "𝔘"]
    g = gauge("odd_values", 'Help with "quotes", a back\\slash\nand a newline.', ["b_label", "a", "Zed"])
    for i, v in enumerate(odd):
        g.add_metric([v, odd[-1 - i], str(i)], i)
    numbers = gauge("numbers", "every kind of number", ["n"])
    for k, v in enumerate(
        [0, -0.0, 1, -1, 0.5, 1e-9, 123456.0, 1234567.0, 1e6, 1e21, 2**63, -1e7, True, float("inf"),
         float("-inf"), float("nan"), 3.141592653589793]
    ):  # fmt: skip
        numbers.add_metric([str(k)], v)
    return [
        g,
        numbers,
        counter("some:colon_events_total", "A counter given with its suffix", ["x"]),
        counter("plain_counter", "no labels", value=7),
        gauge("no_samples_yet", "declared, never filled", ["gpu"]),
        gauge("job:rate:ratio", "recording-rule-like name", value=0.25),
    ]


def snapshot_families() -> list[tuple[str, list[Family]]]:
    d = simulated_daemon("starved-cpu,healthy,starved-io,idle,starved-cpu-mig,small-kernels", seconds=40)
    return [
        ("a simulated fleet", list(families(d.snapshot, 1.5))),
        ("a Hopper GPU", list(families(a_hopper_snapshot(), 0.0))),  # type: ignore[arg-type]
        ("before the first sample", list(families(None, None))),
    ]


@pytest.fixture(scope="module")
def cases() -> list[tuple[str, list[Family]]]:
    return [*snapshot_families(), ("hostile labels and numbers", hostile_families())]


def _both(fams: list[Family], accept: str) -> tuple[tuple[bytes, str], tuple[bytes, str]]:
    fmt, ctype = negotiate(accept)
    encoder, lib_ctype = choose_encoder(accept)
    return (fmt.render(fams), ctype), (encoder(_Families(fams)), lib_ctype)  # type: ignore[arg-type]


@pytest.mark.parametrize("accept", ACCEPTS)
def test_the_same_bytes_and_content_type_as_prometheus_client(
    cases: list[tuple[str, list[Family]]], accept: str
) -> None:
    for what, fams in cases:
        ours, library = _both(fams, accept)
        assert ours[1] == library[1], (what, accept)
        assert ours[0] == library[0], (what, accept)


def test_random_accept_headers_agree_with_the_library_wherever_it_answers(
    cases: list[tuple[str, list[Family]]],
) -> None:
    rng = random.Random(29)
    kinds = ["text/plain", "application/openmetrics-text", "*/*", "application/json", " text/plain ", ""]
    params = ["version=0.0.4", "version=1.0.0", "version=1", "version=2.0", "version=0.0.1", "version=",
              "escaping=allow-utf-8", "escaping=dots", "escaping=values", "escaping=underscores",
              "escaping=x", "q=0.5", "charset=utf-8", "version", " version=1.0.0",
              "version=1.0.0 "]  # fmt: skip
    fams = cases[0][1] + cases[-1][1]
    answered = 0
    for _ in range(400):
        entries = [
            ";".join([rng.choice(kinds), *rng.sample(params, rng.randint(0, 3))])
            for _ in range(rng.randint(1, 3))
        ]
        accept = ",".join(entries)
        try:
            encoder, lib_ctype = choose_encoder(accept)
        except TypeError:
            continue  # the library cannot compare this version (see the test below)
        fmt, ctype = negotiate(accept)
        assert ctype == lib_ctype, accept
        assert fmt.render(fams) == encoder(_Families(fams)), accept  # type: ignore[arg-type]
        answered += 1
    assert answered > 300


@pytest.mark.parametrize("accept", RAISES_IN_THE_LIBRARY)
def test_a_version_that_is_not_a_number_is_passed_over_not_a_failed_scrape(
    accept: str, tmp_path: Path
) -> None:
    """prometheus_client raises on these (the daemon's scrape then got an empty reply and logged a
    traceback every time); gpumon passes over the entry, as if it were absent."""
    with pytest.raises(TypeError):
        choose_encoder(accept)
    d = simulated_daemon(seconds=3)
    body, ctype, _ = d.render_metrics(accept)
    expected = "text/plain; version=1.0.0; charset=utf-8; escaping=dots" if "dots" in accept else TEXT_0_0_4
    assert ctype == expected
    assert b"gpumon_gpu_utilization_ratio{" in body or b"gpumon__gpu__utilization__ratio{" in body


def test_names_that_prometheus_would_refuse_are_refused_here() -> None:
    for bad in ("1starts_with_digit", "has-dash", "", "spa ce"):
        with pytest.raises(ValueError):
            gauge(bad, "x")
    with pytest.raises(ValueError):
        gauge("ok", "x", ["__reserved"])
    with pytest.raises(ValueError):
        gauge("ok", "x", ["a"]).add_metric(["1", "2"], 1)
    with pytest.raises(ValueError):
        gauge("ok", "x", ["a", "a"])  # a scrape with a label twice fails whole in Prometheus


def test_numbers_are_written_the_way_go_writes_them() -> None:
    from prometheus_client.utils import floatToGoString

    for v in [0, -0.0, 1, 1e6, 1234567.0, 12345678.9, 1e-7, 2**53 + 1, float("inf"), float("nan"), -1e22]:
        assert float_text(v) == floatToGoString(v)
    assert float_text(1e6) == "1e+06" and float_text(1) == "1.0" and float_text(float("inf")) == "+Inf"


@pytest.mark.parametrize("version", ["1.0.0.\u00e9", "2.\u00e9", "1.0.0.\x7f", "1.0.0.\tx", "\u0661.0.0"])
def test_a_version_a_header_cannot_carry_is_passed_over_and_the_scrape_answered(version: str) -> None:
    """The library repeats these versions into its content type, which then could not be sent:
    the scraper got an empty reply and the daemon logged a traceback (a hostile review found it)."""
    import socket

    accept = f"application/openmetrics-text; version={version}"
    assert negotiate(accept)[1] == TEXT_0_0_4
    d = simulated_daemon(seconds=3)
    port = d.start_http_only()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: " + accept.encode() + b"\r\n\r\n")
            head = s.recv(65536)
    finally:
        d.stop()
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    assert b"text/plain; version=0.0.4" in head


def test_however_many_versions_scrapers_send_the_daemon_keeps_one_rendering_per_format() -> None:
    """Renderings were kept per content type, which repeats the scraper's version: a client sending
    version=1.0.0.1, 1.0.0.2, ... grew the daemon by ~160 KB a request (3,000 took it to 500 MB)."""
    d = simulated_daemon(seconds=3)
    for i in range(200):
        body, ctype, _ = d.render_metrics(f"application/openmetrics-text; version=1.0.0.{i}")
        assert ctype.startswith(f"application/openmetrics-text; version=1.0.0.{i};")
        assert body.endswith(b"# EOF\n")
    for escaping in ("allow-utf-8", "underscores", "dots", "values"):
        d.render_metrics(f"text/plain; version=1.0.0; escaping={escaping}")
        d.render_metrics(f"application/openmetrics-text; version=1.0.0; escaping={escaping}")
    d.render_metrics("")
    assert len(d.exposition._rendered) <= 8
