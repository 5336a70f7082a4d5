"""Bad input, as a clumsy or hostile user gives it: traces edited by hand or by accident, config
files of any shape, outputs that cannot be written. Each ends in one line and a documented exit
code, in time proportional to the data; never a traceback, never a run that does not end.
The fuzz tests (Hypothesis) hold that over generated inputs; docs/testing.md has the counts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gpumon.analyze.truth import MAX_TRUTH_BYTES
from gpumon.cli import main

from .conftest import gpumon

EXIT_CODES = {0, 1, 2, 3, 4, 5, 6, 7, 130}


@pytest.fixture(scope="module")
def base_trace(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    path = tmp_path_factory.mktemp("base") / "t.jsonl"
    p = gpumon(
        "record", "--simulate", "starved-cpu,healthy", "--speed", "max", "--duration", "15", "-o", str(path)
    )
    assert p.returncode == 0, p.stderr
    return path.read_text().splitlines()


def write(tmp: Path, name: str, lines: list[str]) -> Path:
    p = tmp / name
    p.write_text("\n".join(lines) + "\n")
    return p


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(list(args))
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err
    return code, err


def one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


# -- traces that would run or write forever ---------------------------------------------------------


def test_a_t_s_of_1e12_is_refused_at_once_naming_the_line(base_trace: list[str], tmp_path: Path) -> None:
    tick = json.loads(base_trace[5])
    tick["t_s"] = 1e12
    trace = write(tmp_path, "bad.jsonl", [*base_trace[:5], json.dumps(tick), *base_trace[6:]])
    p = gpumon("analyze", str(trace))  # 1e12 s of ticks would never end: gpumon()'s timeout would fail
    assert p.returncode == 4, p.stderr
    assert f"{trace}:6:" in p.stderr and "Traceback" not in p.stderr


def test_a_long_gap_is_skipped_in_time_proportional_to_the_data(
    base_trace: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shift = 5 * 86400.0  # the recorder was suspended for five days
    out = []
    for i, line in enumerate(base_trace):
        d = json.loads(line)
        if d.get("type") == "tick" and i > 8:
            d["t_s"] += shift
            for g in d["gpus"]:
                g["util_history"] = [[t + shift, u] for t, u in g["util_history"]]
        out.append(json.dumps(d))
    trace = write(tmp_path, "gap.jsonl", out)
    code, _ = run_cli(capsys, "analyze", str(trace), "--json")
    assert code == 0
    # the five days between are passed over, not sampled: one verdict per tick of data, no more
    from gpumon.analyze.trace_report import analyze

    ticks_in = sum(json.loads(line).get("type") == "tick" for line in out)
    assert all(len(g.verdicts) <= ticks_in for g in analyze(str(trace)).gpus)
    copy = tmp_path / "copy.jsonl"
    code, _ = run_cli(capsys, "record", "--replay", str(trace), "--speed", "max", "-o", str(copy))
    assert code == 0
    ticks = sum('"type":"tick"' in ln for ln in copy.read_text().splitlines())
    assert ticks <= sum('"type": "tick"' in ln or '"type":"tick"' in ln for ln in out) + 2, "no empty ticks"


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (lambda h, t: (h, t.replace('"util_history":[[', '"util_history":[[NaN,', 1)), "NaN"),
        (lambda h, t: (h, t.replace('"util_ratio":', '"util_ratio":1e999,"x":', 1)), "1e999"),
        (lambda h, t: (h, "[" * 50000 + "]" * 50000), "nested too deeply"),
        (lambda h, t: ({**h, "source": ["x"]}, t), "'source' must be an object"),
        (lambda h, t: ({**h, "interval_s": 1e-9}, t), "'interval_s' must be a number"),
        (lambda h, t: ({**h, "interval_s": "1"}, t), "'interval_s' must be a number"),
    ],
)
def test_garbled_traces_exit_4_naming_file_and_line(
    base_trace: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], mutate, needle: str
) -> None:
    header, tick = mutate(json.loads(base_trace[0]), base_trace[3])
    trace = write(tmp_path, "t.jsonl", [json.dumps(header), *base_trace[1:3], tick, *base_trace[4:]])
    for args in (
        ["analyze", str(trace)],
        ["record", "--replay", str(trace), "--speed", "max", "-o", str(tmp_path / "o")],
    ):
        code, err = run_cli(capsys, *args)
        assert code == 4 and needle in one_line(err) and str(trace) in err, err


def test_a_header_only_trace_is_one_rule_for_analyze_and_replay(
    base_trace: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write(tmp_path, "h.jsonl", base_trace[:1])
    for args in (
        ["analyze", str(trace)],
        ["record", "--replay", str(trace), "-o", str(tmp_path / "o.jsonl")],
    ):
        code, err = run_cli(capsys, *args)
        assert code == 4 and "holds no ticks" in one_line(err)


# -- exit codes that tell the truth -----------------------------------------------------------------


def test_a_full_disk_while_recording_is_exit_5(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_cli(
        capsys,
        "record",
        "--simulate",
        "healthy",
        "--speed",
        "max",
        "--duration",
        "60",
        "-o",
        "/dev/full",
        "--force",
    )
    assert code == 5 and "No space left" in one_line(err)


def test_standard_output_that_cannot_be_written_is_exit_5(tmp_path: Path) -> None:
    import subprocess
    import sys

    from .conftest import ROOT

    with open("/dev/full", "w") as full:
        p = subprocess.run(
            [sys.executable, "-m", "gpumon", "devices", "--simulate", "healthy", "--json"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            timeout=60,
        )
    assert p.returncode == 5 and "standard output" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize(
    "plot,needle",
    [("DIR", "is a directory"), ("x.txt", "must name a .png file"), ("nope/x.png", "no such directory")],
)
def test_plot_names_the_png_exactly(
    base_trace: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], plot: str, needle: str
) -> None:
    trace = write(tmp_path, "t.jsonl", base_trace)
    (tmp_path / "DIR").mkdir()
    target = str(tmp_path / plot) if plot != "nope/x.png" else str(tmp_path / "nope" / "x.png")
    with pytest.raises(SystemExit) as e:
        main(["analyze", str(trace), "--plot", target])
    assert e.value.code == 2 and needle in capsys.readouterr().err
    assert not (tmp_path / "DIR.png").exists()


@pytest.mark.parametrize(
    "content", [None, b"\x7fELF\x02\x01\x01\x00\x00\x00\xff\xfe", b'{"start_unix_s": NaN}\n']
)
def test_a_bad_truth_file_is_a_clear_error_before_the_work(
    base_trace: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None
) -> None:
    trace = write(tmp_path, "t.jsonl", base_trace)
    truth = tmp_path / "truth.jsonl"
    if content is not None:
        truth.write_bytes(content)
    code, err = run_cli(capsys, "analyze", str(trace), "--truth", str(truth))
    assert code == 4 and str(truth) in one_line(err)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory", "too-large"])
def test_a_truth_file_that_is_not_one_is_refused_unread(
    base_trace: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """Every read bounded, only regular files opened: a FIFO once hung `analyze --truth` for good
    and /dev/zero took 13 GB in 15 s (found by a hostile-input pass)."""
    import os

    trace = write(tmp_path, "t.jsonl", base_trace)
    truth = tmp_path / "truth.jsonl"
    if kind == "fifo":
        os.mkfifo(truth)
    elif kind == "dev-zero":
        truth.symlink_to("/dev/zero")
    elif kind == "directory":
        truth.mkdir()
    else:
        with open(truth, "wb") as f:
            f.truncate(MAX_TRUTH_BYTES + 1)  # sparse: no disk, and one line of zeros
    code, err = run_cli(capsys, "analyze", str(trace), "--truth", str(truth))
    line = one_line(err)
    assert code == 4 and str(truth) in line
    assert ("not a truth file" in line) and ("MiB" in line if kind == "too-large" else "regular" in line)


def test_a_config_nested_too_deeply_is_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "deep.toml"
    f.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    code, err = run_cli(capsys, "serve", "--check-config", "--config", str(f))
    assert code == 7 and str(f) in one_line(err)


def test_a_missing_drive_file_is_an_error_not_a_gpu() -> None:
    p = gpumon("devices", "--drive", "/nonexistent/drive.txt")
    assert p.returncode == 2 and "no such file" in p.stderr and "GPU-" not in p.stdout


# -- fuzz: generated traces and config files ------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)
FUZZ = settings(
    max_examples=int(os.environ.get("GPUMON_FUZZ_EXAMPLES", "150")),  # docs/testing.md: a deeper run
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@FUZZ
@given(data=st.data())
def test_fuzzed_traces_end_in_a_documented_exit_code(
    data: st.DataObject, base_trace: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = list(base_trace[:8])
    which = data.draw(st.integers(0, len(lines) - 1), label="line")
    kind = data.draw(st.sampled_from(["value", "bytes", "drop-key", "raw"]), label="kind")
    if kind == "raw":
        lines[which] = data.draw(st.text(max_size=60), label="raw")
    elif kind == "bytes":
        blob = data.draw(st.binary(max_size=40), label="bytes")
        path = tmp_path / "fuzz.jsonl"
        path.write_bytes(
            ("\n".join(lines[:which]) + "\n").encode() + blob + b"\n" + "\n".join(lines[which + 1 :]).encode()
        )
        code, _ = run_cli(capsys, "analyze", str(path))
        event(f"exit {code}")
        assert code in (0, 4)
        return
    else:
        doc = json.loads(lines[which])
        target = doc
        path_keys = []
        while isinstance(target, dict) and target:
            key = data.draw(st.sampled_from(sorted(target)), label="key")
            path_keys.append(key)
            if not isinstance(target[key], (dict, list)) or data.draw(st.booleans(), label="stop"):
                break
            nxt = target[key]
            if isinstance(nxt, list):
                if not nxt:
                    break
                nxt = nxt[data.draw(st.integers(0, len(nxt) - 1), label="index")]
                if not isinstance(nxt, dict):
                    break
            target = nxt
        if isinstance(target, dict) and path_keys and path_keys[-1] in target:
            if kind == "drop-key":
                del target[path_keys[-1]]
            else:
                target[path_keys[-1]] = data.draw(JSON_VALUES, label="value")
        lines[which] = json.dumps(doc)
    path = write(tmp_path, "fuzz.jsonl", lines)
    code, _ = run_cli(capsys, "analyze", str(path))
    event(f"exit {code}")
    assert code in (0, 4)


TOML_KEYS = [
    "listen",
    "interval_s",
    "window_s",
    "simulate",
    "gpus",
    "seed",
    "sample_period_s",
    "replay",
    "drive",
    "nvml_call_timeout_s",
    "nvml_stale_s",
    "max_connections",
    "request_timeout_s",
    "log_level",
    "web_config_file",
    "bogus",
]
TOML_VALUES = st.sampled_from(
    [
        "1",
        "0",
        "-1",
        "1e400",
        "nan",
        "inf",
        "-inf",
        '"x"',
        '""',
        "true",
        "[1, 2]",
        "{a = 1}",
        "0.05",
        '"healthy"',
        '"starved-cpu,healthy"',
        '":9877"',
        '"[::1]:0"',
        '"/nonexistent"',
        "1979-05-27",
        "3600",
        "65537",
        "1.5",
    ]
)


@FUZZ
@given(
    body=st.lists(st.tuples(st.sampled_from(TOML_KEYS), TOML_VALUES), max_size=5),
    thresholds=st.lists(
        st.tuples(st.sampled_from(["fed_duty", "window_s", "confirm_s", "min_points", "nope"]), TOML_VALUES),
        max_size=3,
    ),
    junk=st.binary(max_size=12),
)
def test_fuzzed_config_files_exit_0_or_7_with_the_file_named(
    body: list[tuple[str, str]],
    thresholds: list[tuple[str, str]],
    junk: bytes,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = "".join(f"{k} = {v}\n" for k, v in dict(body).items())
    if thresholds:
        text += "[thresholds]\n" + "".join(f"{k} = {v}\n" for k, v in dict(thresholds).items())
    f = tmp_path / "fuzz.toml"
    f.write_bytes(text.encode() + (junk if junk[:1] == b"#" else b""))
    code, err = run_cli(capsys, "serve", "--check-config", "--config", str(f))
    event(f"exit {code}")
    assert code in (0, 7), err
    if code == 7:
        assert "\n" not in err.strip() and (str(f) in err or "GPUMON" in err or "web" in err), err


def test_names_from_a_trace_reach_the_terminal_without_their_escapes(
    base_trace: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A GPU name or uuid in a trace is data from elsewhere: printed raw, `\\x1b[2J` cleared the
    reader's screen (found by a hostile-input pass; `report` already replaced them)."""
    import json

    lines = []
    for line in base_trace:
        rec = json.loads(line)
        for g in rec.get("gpus", []):
            g["name"] = "H100 \x1b[31mEVIL\x1b[2J\x07"
            g["uuid"] = "GPU-\x1b]0;title\x07"
        lines.append(json.dumps(rec))
    trace = write(tmp_path, "esc.jsonl", lines)
    for args in (["analyze", str(trace)], ["devices", "--replay", str(trace)]):
        code = main(args)
        out = capsys.readouterr().out
        assert code == 0 and "EVIL" in out, (args, out[-300:])
        assert "\x1b" not in out and "\x07" not in out, args
