"""Every Grafana panel query and every alert expression, run by a REAL Prometheus (Debian's `prometheus`)
scraping a live worker and the live Triton (issue #14): the queries return data, the alert expressions are
valid and every series they use is there."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import pytest
from modpipe.loadgen.smoke import end_consumer

from modpipe.services.process import free_port
from tests.integration.test_streaming import collect_decisions, produce_posts
from tests.unit.test_deploy_manifests import DASHBOARD, alert_rules, dashboard_queries, promql_series

pytestmark = pytest.mark.integration

NAMESPACE = "modpipe"
# The dashboard's variables as Grafana fills them in for this Prometheus.
DASHBOARD_VALUES = {"datasource": "prometheus", "namespace": NAMESPACE, "job": "modpipe-worker", "triton_job": "triton",
                    "__rate_interval": "1m"}


@pytest.fixture
def prometheus(tmp_path):
    """Start Prometheus on a free port with the given scrape targets (job -> host:port); stopped afterwards."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is not installed; `make setup` installs it (Debian package prometheus)"
    procs = []

    def start(targets: dict[str, str]) -> str:
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(json.dumps({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            # the namespace label a ServiceMonitor or deploy/prometheus/prometheus.yml gives each target
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [target], "labels": {"namespace": NAMESPACE}}]}
                               for job, target in targets.items()]}))
        proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "wb"))
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        # It listens before its storage is open and answers 503 to queries until then: wait for /-/ready.
        deadline = time.monotonic() + 60
        while not ready(url):
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()
            time.sleep(0.2)
        return url

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(10)


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=5) as r:
            return r.status == 200
    except OSError:  # refused while it starts, or HTTPError 503 while its storage opens
        return False


def query(url: str, expr: str) -> dict:
    with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}), timeout=10) as r:
        return json.loads(r.read())


def test_dashboard_queries_and_alert_expressions_return_data(local_stack, pipeline_settings, triton_server,
                                                            model_build, prometheus):
    stack = local_stack(workers=1)
    consumer = end_consumer(pipeline_settings, stack.bootstrap, [stack.topics.decisions])
    posts = produce_posts(pipeline_settings, 40, "observed", model_build.heldout())
    assert set(collect_decisions(consumer, set(posts), 120)) == set(posts)
    url = prometheus({"modpipe-worker": f"127.0.0.1:{stack.workers[0].metrics_port}",
                      "triton": f"127.0.0.1:{triton_server.metrics_port}"})
    deadline = time.monotonic() + 60  # Prometheus hands discovered targets to its scrapers every 5 s
    while len(query(url, "up == 1")["data"]["result"]) < 2:
        assert time.monotonic() < deadline, query(url, "up")
        time.sleep(0.5)
    more = produce_posts(pipeline_settings, 40, "observed-2", model_build.heldout())  # traffic while scraped
    assert set(collect_decisions(consumer, set(more), 120)) == set(more)
    consumer.close()
    time.sleep(5)  # a few scrapes after the traffic: rate() needs two samples

    empty = []
    for title, expr in dashboard_queries(DASHBOARD_VALUES):
        answer = query(url, expr)
        assert answer["status"] == "success", (title, expr, answer)
        if not answer["data"]["result"]:
            empty.append((title, expr))
    assert not empty, f"dashboard queries without data: {empty}"
    # and its variables offer the values filled in above (label_values(series{...}, label) as a query)
    for var in json.loads(DASHBOARD.read_text())["templating"]["list"]:
        if var["type"] == "query":
            series, label = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"]["query"]).groups()
            series = series.replace("$namespace", NAMESPACE)
            offered = {r["metric"].get(label) for r in query(url, f"group by ({label}) ({series})")["data"]["result"]}
            assert DASHBOARD_VALUES[var["name"]] in offered, (var["name"], offered)

    missing = []
    for rule in alert_rules():
        answer = query(url, rule["expr"])
        assert answer["status"] == "success", (rule["alert"], answer)
        for series in promql_series(rule["expr"]):
            if not query(url, f"count({series})")["data"]["result"]:
                missing.append((rule["alert"], series))
    assert not missing, f"alert expressions use series Prometheus did not scrape: {missing}"
