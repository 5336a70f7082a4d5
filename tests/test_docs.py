"""Keep the references true: every metric the exporter produces is documented, and every
configuration key and detector threshold appears in the configuration reference."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from gpumon.config.settings import Config
from gpumon.detect.thresholds import Thresholds

from .conftest import ROOT


def metrics_with_a_job(tmp: Path) -> str:
    """/metrics of a fleet where the Slurm prolog has run: the series only a job brings."""
    import os
    import subprocess

    from gpumon.core.clock import VirtualClock
    from gpumon.serve.daemon import Daemon

    env = {
        "PATH": os.environ["PATH"],
        "GPUMON_JOBS_DIR": str(tmp),
        "GPUMON_NVIDIA_SMI": "/nonexistent",
        "SLURM_JOB_ID": "1",
        "SLURM_JOB_USER": "u",
        "SLURM_JOB_GPUS": "0",
    }
    subprocess.run([str(ROOT / "contrib/slurm/gpumon-prolog")], env=env, check=True)
    d = Daemon(
        Config(
            simulate="healthy", gpus=2, listen="127.0.0.1:0", jobs_dir=str(tmp), record_dir=str(tmp / "rec")
        ),
        clock=VirtualClock(),
    )
    d.sampler.run(duration_s=2)
    return d.render_metrics("")[0].decode()


def a_hopper_snapshot() -> object:
    """A snapshot of a GPU with GPM, clock events and an XID (issue 14), which no simulated GPU
    has all of (tests/test_hopper.py serves them through the stand-in driver)."""
    from gpumon.collect.pipeline.spec import SourceDescription
    from gpumon.core.model import GpmActivity, GpuSample, Tick, XidCount
    from gpumon.serve.snapshot import Snapshot

    gpm = GpmActivity(*([0.5] * 8), 1e9, 1e8, 2e9, 2e8)
    g = GpuSample(
        1.0, 0, "GPU-0", "H100", clock_events=0x4, clock_event_s=(("sw_power_cap", 3.0),),
        xids=(XidCount(79, 1),), last_xid=(79, 1.7e9), gpm=gpm, mig=None,
    )  # fmt: skip
    return Snapshot(1.0, Tick(1.0, (g,), None), (), {}, {}, 1, 0, SourceDescription.nvml())


def metrics_of_a_hopper_gpu() -> str:
    """The exporter's series for a_hopper_snapshot()."""
    from gpumon.serve.metrics import families
    from gpumon.serve.textformat import render_text

    return render_text(families(a_hopper_snapshot(), 0.0)).decode()  # type: ignore[arg-type]


def test_every_metric_is_in_docs_metrics_md(tmp_path: Path) -> None:
    text = (
        (ROOT / "tests/golden/metrics.txt").read_text()
        + metrics_with_a_job(tmp_path)
        + metrics_of_a_hopper_gpu()
    )
    produced = set(re.findall(r"^# TYPE (\S+)", text, re.M))
    documented = set(re.findall(r"`(gpumon_[a-z0-9_]+)`", (ROOT / "docs/metrics.md").read_text()))
    missing = {n for n in produced if n not in documented and n + "_total" not in documented}
    assert not missing, f"document these in docs/metrics.md: {sorted(missing)}"
    stale = {n for n in documented if n not in produced and n.removesuffix("_total") not in produced}
    assert not stale, f"docs/metrics.md lists metrics gpumon does not produce: {sorted(stale)}"


def test_every_config_key_and_threshold_is_documented() -> None:
    text = (ROOT / "docs/configuration.md").read_text() + (ROOT / "docs/detector.md").read_text()
    keys = {f.name for f in fields(Config)} - {"thresholds", "source_path"}
    missing = {k for k in keys if f"`{k}`" not in text and k not in text}
    assert not missing, missing
    missing_th = {f.name for f in fields(Thresholds) if f"`{f.name}`" not in text}
    assert not missing_th, f"document these thresholds in docs/detector.md: {sorted(missing_th)}"


def test_the_readme_starts_where_a_user_starts() -> None:
    """issue 27: the two commands stay on top; then what it is, a picture, an install that works
    on Debian 12 (a virtual environment), the commands to try; everything else in docs/."""
    text = (ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) <= 200
    assert lines[3].startswith("./scripts/run.sh ") and lines[4].startswith("./scripts/test.sh ")
    first_screen = "\n".join(lines[:60])
    for needed in (
        "![",
        "docs/images/",
        "python3 -m venv",
        "pipx install",
        "gpumon demo",
        "gpumon watch --simulate",
        "gpumon serve --simulate starved-cpu,healthy",
        "systemctl enable --now pmcd",
        'sudo "$(command -v gpumon)" dstat-plugin install --system',
        "dstat -c --gpu 1 3",
    ):
        assert needed in first_screen, needed
    assert "sudo pip install" not in text


def test_every_relative_link_in_the_readme_and_docs_resolves() -> None:
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" in target:
                continue
            assert (doc.parent / target).exists(), f"{doc.name}: {target}"


def test_the_dstat_codes_and_the_scenarios_are_all_documented() -> None:
    import ast

    from gpumon.sim.scenarios import SCENARIOS

    plugin = ast.parse((ROOT / "gpumon/dstat/plugin/dstat_gpu.py").read_text())
    codes = next(
        ast.literal_eval(node.value)
        for node in plugin.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_gpumon_state_codes"
    )
    dstat = (ROOT / "docs/dstat.md").read_text()
    missing = [c for c in codes.values() if f"`{c}`" not in dstat]
    assert not missing, f"docs/dstat.md lists no {missing}"
    usage = (ROOT / "docs/usage.md").read_text()
    missing = [name for name in SCENARIOS if f"`{name}`" not in usage]
    assert not missing, f"docs/usage.md's scenario table lacks {missing}"
    assert "**duty cycle**" in usage and "**duty cycle**" in (ROOT / "README.md").read_text()
