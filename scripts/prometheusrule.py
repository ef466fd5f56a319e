"""Writes deploy/k8s/components/prometheus-operator/prometheusrule.yaml from deploy/prometheus/alerts.yaml.

alerts.yaml stays the one source of the rules (promtool checks and unit-tests it; Prometheus without the
operator loads it as a rule file); the PrometheusRule is the same text under `spec:`, comments included.
`make rules` runs this; tests/unit/test_deploy_manifests.py fails when the two differ.
    python scripts/prometheusrule.py [--check]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
RULE = ROOT / "deploy" / "k8s" / "components" / "prometheus-operator" / "prometheusrule.yaml"

HEADER = """\
# Generated from deploy/prometheus/alerts.yaml by scripts/prometheusrule.py (`make rules`): edit that file.
# The operator loads these rules into each Prometheus whose ruleSelector matches this object's labels; add
# your Prometheus' selector label in the overlay (kube-prometheus-stack: `release: <its Helm release>`).
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: modpipe
  labels:
    app.kubernetes.io/name: modpipe
    app.kubernetes.io/component: alerts
spec:
"""


def render(alerts_text: str) -> str:
    """The PrometheusRule: alerts.yaml from its `groups:` line on, indented under `spec:`."""
    lines = alerts_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("groups:"))
    body = "".join(f"  {line}\n" if line.strip() else "\n" for line in lines[start:])
    return HEADER + body


def main(argv: list[str]) -> int:
    text = render(ALERTS.read_text())
    if "--check" in argv:
        if not RULE.exists() or RULE.read_text() != text:
            print(f"{RULE.relative_to(ROOT)} differs from {ALERTS.relative_to(ROOT)}: run `make rules`",
                  file=sys.stderr)
            return 1
        return 0
    RULE.write_text(text)
    print(f"wrote {RULE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
