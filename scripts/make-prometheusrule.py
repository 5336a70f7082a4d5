#!/usr/bin/env python3
"""Write deploy/kubernetes/prometheusrule.yaml from monitoring/gpumon.rules.yml, so the Prometheus
operator loads exactly the shipped rules (tests/test_kubernetes.py checks that they match).

    python scripts/make-prometheusrule.py
"""

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
rules = yaml.safe_load((ROOT / "monitoring/gpumon.rules.yml").read_text())
doc = {
    "apiVersion": "monitoring.coreos.com/v1",
    "kind": "PrometheusRule",
    "metadata": {"name": "gpumon", "namespace": "gpumon", "labels": {"app.kubernetes.io/name": "gpumon"}},
    "spec": {"groups": rules["groups"]},
}
header = (
    "# Generated from monitoring/gpumon.rules.yml by scripts/make-prometheusrule.py: edit the rules\n"
    "# there and run it again (tests/test_kubernetes.py fails while the two differ).\n"
)
out = ROOT / "deploy/kubernetes/prometheusrule.yaml"
out.write_text(header + yaml.safe_dump(doc, sort_keys=False, width=100))
print(out)
