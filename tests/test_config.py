"""Configuration as one source of truth: every setting is accepted or refused the same way from
the TOML file, the environment and the flags, and `serve --check-config` refuses everything the
real start would refuse, each with one line naming the file (or flag) and the key."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import bcrypt
import pytest

from gpumon.cli import main
from gpumon.cli import serve as serve_cmd
from gpumon.cli.app import build_parser
from gpumon.config.settings import SETTINGS, load

from .conftest import ROOT, free_port, gpumon, start_serve


def check_config(tmp_path: Path, toml: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Exit code and stderr of `gpumon serve --check-config` on this file (stdout to .out)."""
    f = tmp_path / "gpumon.toml"
    f.write_text(toml)
    code = main(["serve", "--check-config", "--config", str(f)])
    captured = capsys.readouterr()
    (tmp_path / ".out").write_text(captured.out)
    assert "Traceback" not in captured.err
    return code, captured.err


# -- a value given only in the file survives ----------------------------------------------------


def test_values_set_only_in_the_file_are_not_overridden_by_flag_defaults(tmp_path: Path) -> None:
    f = tmp_path / "gpumon.toml"
    f.write_text('simulate = "healthy"\nseed = 7\nsample_period_s = 0.5\ninterval_s = 2\n')
    args = build_parser().parse_args(["serve", "--config", str(f)])
    cfg = serve_cmd.load(args)
    assert (cfg.seed, cfg.sample_period_s, cfg.interval_s) == (7, 0.5, 2.0)
    args = build_parser().parse_args(["serve", "--config", str(f), "--seed", "9", "--log-level", "debug"])
    cfg = serve_cmd.load(args)
    assert cfg.seed == 9 and cfg.sample_period_s == 0.5 and cfg.log_level == "debug"


def test_a_toml_seed_is_what_the_daemon_serves(tmp_path: Path) -> None:
    f = tmp_path / "gpumon.toml"
    f.write_text('simulate = "healthy"\nseed = 7\n')
    port = free_port()
    proc = start_serve("--config", str(f), port=port)
    try:
        deadline = time.monotonic() + 20
        state: dict[str, object] = {}
        while not state.get("ready"):
            assert time.monotonic() < deadline and proc.poll() is None, "serve never became ready"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/state", timeout=2) as r:
                    state = json.load(r)
            except OSError:
                time.sleep(0.1)
        assert state["source"]["seed"] == 7  # type: ignore[index]
    finally:
        proc.terminate()
        proc.wait(10)


def test_drive_in_the_file_is_a_setting_like_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    drive = tmp_path / "drive.txt"
    drive.write_text("")  # the job has not started yet: an empty drive file is fine
    code, err = check_config(tmp_path, f'drive = "{drive}"\n', capsys)
    assert code == 0, err
    assert f"driven by the job writing {drive}" in (tmp_path / ".out").read_text()
    # a data-parallel job's file, started before the recorder (its launcher's line first): it was
    # refused as "not a drive file" (found by a helper fixing the drive reader)
    drive.write_text("# gpumon-drive v2 ranks=2\n# gpumon-drive v2 pid=4242 rank=0\n")
    code, err = check_config(tmp_path, f'drive = "{drive}"\n', capsys)
    assert code == 0, err


# -- --check-config refuses what the start would refuse -------------------------------------------


def _web(tmp_path: Path, text: str) -> str:
    w = tmp_path / "web.yml"
    w.write_text(text)
    return str(w)


@pytest.mark.parametrize(
    "toml,key",
    [
        ("interval_s = nan\n", "interval_s"),
        ("interval_s = inf\n", "interval_s"),
        ("request_timeout_s = nan\n", "request_timeout_s"),
        ("nvml_call_timeout_s = -inf\n", "nvml_call_timeout_s"),
        ("[thresholds]\nconfirm_s = nan\n", "confirm_s"),
        ("[thresholds]\nwindow_s = inf\n", "window_s"),
        ('simulate = "bogus"\n', "simulate"),
        ('replay = "/nonexistent/trace.jsonl"\n', "replay"),
        ('drive = "/nonexistent/drive.txt"\n', "drive"),
        ('simulate = "healthy"\ngpus = 0\n', "gpus"),
        ('simulate = "healthy"\ngpus = 100000\n', "gpus"),
        ('simulate = "healthy,idle"\ngpus = 1\n', "gpus"),
        ("gpus = 2\n", "gpus"),
        ("seed = -1\n", "seed"),
        ("sample_period_s = 0.01\n", "sample_period_s"),
        ("max_connections = 1.5\n", "max_connections"),
        ("window_s = 10\n", "window_s"),
        ("interval_s = true\n", "interval_s"),
        ('interval_s = "\u0662"\n', "interval_s"),  # an Arabic-Indic two: float() reads it as 2
    ],
)
def test_check_config_refuses_bad_values_naming_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], toml: str, key: str
) -> None:
    code, err = check_config(tmp_path, toml, capsys)
    assert code == 7, err
    line = err.strip()
    assert "\n" not in line and str(tmp_path / "gpumon.toml") in line and key in line, line


def test_check_config_refuses_a_replay_that_is_not_a_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "not-a-trace.jsonl"
    bad.write_text('{"hello": 1}\n')
    code, err = check_config(tmp_path, f'replay = "{bad}"\n', capsys)
    assert code == 7 and "replay" in err and "not a gpumon trace" in err, err


def test_check_config_refuses_a_binary_drive_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "drive.bin"
    bad.write_bytes(b"\x7fELF\x00\x01\x02")
    code, err = check_config(tmp_path, f'drive = "{bad}"\n', capsys)
    assert code == 7 and "drive" in err and "not a drive file" in err, err


def test_a_config_file_that_begins_with_a_bom_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Some editors begin a UTF-8 file with a byte order mark: the web config's YAML took it, the
    TOML file was refused ("Invalid statement (line 1, column 1)"; found by a hostile-input pass)."""
    f = tmp_path / "gpumon.toml"
    f.write_bytes(b"\xef\xbb\xbfinterval_s = 2\n")
    code = main(["serve", "--check-config", "--config", str(f)])
    assert code == 0, capsys.readouterr().err


@pytest.mark.parametrize(
    "content,needle",
    [
        (b"\x00\x01\x02binary", "binary"),
        ('listen = ":9877"\n# caf\xe9\n'.encode("latin-1"), "not UTF-8"),
    ],
)
def test_check_config_refuses_a_file_that_is_not_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, needle: str
) -> None:
    f = tmp_path / "gpumon.toml"
    f.write_bytes(content)
    code = main(["serve", "--check-config", "--config", str(f)])
    err = capsys.readouterr().err
    assert code == 7 and needle in err and str(f) in err and "Traceback" not in err, err


GOOD_HASH = "$2b$04$" + "a" * 53  # the shape of a bcrypt hash (its value is never checked here)


@pytest.mark.parametrize(
    "web,needle",
    [
        ("basic_auth_users:\n  alice: $2b$12$short\n", "basic_auth_users.alice: expected a bcrypt hash"),
        ("basic_auth_users:\n  alice: hunter2\n", "basic_auth_users.alice"),
        ("tls_server_config:\n  clientca_file: /x\n", "unknown key tls_server_config.'clientca_file'"),
        ("http_server_config:\n  http2: true\n", "http_server_config.http2"),
        ("http_server_config:\n  headers:\n    X-Powered-By: me\n", "'X-Powered-By' cannot be set"),
        (
            "tls_server_config:\n  min_version: TLS13\n",
            "tls_server_config sets min_version but not cert_file",
        ),
        ("rate_limit:\n  interval: 1s\n", "unknown key 'rate_limit'"),
        # a key given twice: YAML's loader kept the last, so an empty second users list turned
        # basic auth off (found by a hostile-input pass)
        (f"basic_auth_users:\n  alice: {GOOD_HASH}\nbasic_auth_users: {{}}\n", ":3: not valid YAML: key"),
        (f"basic_auth_users:\n  alice: {GOOD_HASH}\n  alice: {GOOD_HASH}\n", "'alice' given twice"),
        ("http_server_config:\n  http2: false\n  http2: false\n", "'http2' given twice"),
    ],
)
def test_check_config_refuses_a_bad_web_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], web: str, needle: str
) -> None:
    code, err = check_config(tmp_path, f'web_config_file = "{_web(tmp_path, web)}"\n', capsys)
    assert code == 7 and needle in err and "web.yml" in err, err


def test_check_config_accepts_a_good_web_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    web = _web(tmp_path, f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    code, err = check_config(tmp_path, f'web_config_file = "{web}"\n', capsys)
    assert code == 0, err


def test_tls_files_are_read_beside_the_web_config_and_named_when_they_cannot_be(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative cert_file is read from the web config's directory, as exporter-toolkit reads it
    (it was read from the working directory: / under systemd); a missing or huge one is named
    (OpenSSL's own error says no file). Found by a hostile-input pass."""
    import subprocess

    from gpumon.serve.webconfig import WebConfigError, load_web_config

    pki = tmp_path / "pki"
    pki.mkdir()
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(pki / "k.pem"),
         "-out", str(pki / "c.pem"), "-days", "1", "-subj", "/CN=localhost"],
        check=True, capture_output=True,
    )  # fmt: skip
    web = tmp_path / "web.yml"
    web.write_text("tls_server_config:\n  cert_file: pki/c.pem\n  key_file: pki/k.pem\n")
    monkeypatch.chdir("/")
    load_web_config(str(web)).ssl_context()  # found beside the file, from anywhere
    web.write_text("tls_server_config:\n  cert_file: pki/c.pem\n  key_file: pki/missing.pem\n")
    with pytest.raises(WebConfigError, match=r"key_file .*missing.pem: No such file"):
        load_web_config(str(web)).ssl_context()
    with open(pki / "big.pem", "wb") as f:
        f.truncate(2 << 20)
    web.write_text("tls_server_config:\n  cert_file: pki/big.pem\n  key_file: pki/k.pem\n")
    with pytest.raises(WebConfigError, match=r"cert_file .*big.pem: larger than 1 MiB"):
        load_web_config(str(web)).ssl_context()


def test_environment_values_get_the_same_checks(tmp_path: Path) -> None:
    from gpumon.config.settings import ConfigError

    with pytest.raises(ConfigError, match=r"GPUMON_INTERVAL \(interval_s\): must be a finite number"):
        load(None, {"GPUMON_INTERVAL": "nan"}, {})
    with pytest.raises(ConfigError, match=r"GPUMON_SEED \(seed\): must be a whole number"):
        load(None, {"GPUMON_SEED": "7.5"}, {})
    assert load(None, {"GPUMON_SEED": "7", "GPUMON_SIMULATE": "healthy"}, {}).seed == 7


# -- flags: the same ranges, exit 2 naming the flag -----------------------------------------------


@pytest.mark.parametrize(
    "args,flag",
    [
        (["record", "--simulate", "healthy", "-o", "x", "--interval", "1e400"], "--interval"),
        (["record", "--simulate", "healthy", "-o", "x", "--interval", "1e-12"], "--interval"),
        (["record", "--simulate", "healthy", "-o", "x", "--interval", "nan"], "--interval"),
        (["record", "--simulate", "healthy", "-o", "x", "--speed", "1e-300"], "--speed"),
        (["record", "--simulate", "healthy", "-o", "x", "--speed", "inf"], "--speed"),
        (["record", "--simulate", "healthy", "-o", "x", "--duration", "nan"], "--duration"),
        (["watch", "--simulate", "healthy", "--threshold", "window_s=inf"], "--threshold"),
        (["watch", "--simulate", "healthy", "--threshold", "confirm_s=nan"], "--threshold"),
        (["serve", "--check-config", "--interval", "inf"], "--interval"),
        (["serve", "--check-config", "--listen", "[::1:99"], "--listen"),
        (["serve", "--check-config", "--listen", "127.0.0.1:\u0669\u0668\u0667\u0667"], "--listen"),
        (["devices", "--simulate", "healthy", "--seed", "-3"], "--seed"),
    ],
)
def test_bad_flag_values_exit_2_naming_the_flag(tmp_path: Path, args: list[str], flag: str) -> None:
    p = gpumon(*args, cwd=tmp_path, timeout=30)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr and f"argument {flag}" in p.stderr, p.stderr
    assert not (tmp_path / "x").exists()


def test_the_minimum_interval_is_documented() -> None:
    text = (ROOT / "docs/configuration.md").read_text()
    s = SETTINGS["interval_s"]
    assert f"{s.spec.minimum:g}" in text


def test_every_setting_is_in_the_configuration_reference_with_its_flag_and_variable() -> None:
    text = (ROOT / "docs/configuration.md").read_text()
    rows = {ln.split("|")[1].strip().strip("`"): ln for ln in text.splitlines() if ln.startswith("| `")}
    for key, s in SETTINGS.items():
        assert key in rows, f"docs/configuration.md has no row for {key}"
        if s.spec.flag:
            assert f"`{s.spec.flag}" in rows[key], (key, s.spec.flag)
        if s.spec.env:
            assert f"`{s.spec.env}`" in rows[key], (key, s.spec.env)


@pytest.mark.parametrize(
    "text",
    [
        "base: &b {a: 1}\nk1:\n  x: &d\n    <<: *b\n    a: 2\nk2:\n  <<: *d\n",  # (review: refused once)
        "a: &x {k: 1}\nb:\n  <<: *x\n  k: 2\n",
        "a: [1, 2]\nb: {c: {d: 1}}\n",
    ],
)
def test_the_strict_yaml_loader_reads_merge_keys_as_yaml_does(text: str) -> None:
    """Refusing a key given twice must not refuse YAML's merges (`<<:`), whose keys may be given
    again: the same document as PyYAML's safe_load."""
    import yaml

    from gpumon.serve.webconfig import _strict_loader

    assert yaml.load(text, Loader=_strict_loader(yaml)) == yaml.safe_load(text)
