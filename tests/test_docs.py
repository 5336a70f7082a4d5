"""Keep the references true: every metric the exporter produces is documented, and every
configuration key and detector threshold appears in the configuration reference."""

from __future__ import annotations

import re
from dataclasses import fields

from gpumon.config import Config
from gpumon.detector.config import Thresholds

from .conftest import ROOT


def test_every_metric_is_in_docs_metrics_md() -> None:
    produced = set(re.findall(r"^# TYPE (\S+)", (ROOT / "tests/golden/metrics.txt").read_text(), re.M))
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
