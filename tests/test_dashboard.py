# The Grafana dashboard (contrib/grafana): the JSON file is the one panels.py
# makes, every metric its PromQL names is one a real daemon serves (on the
# engine it is about), and each panel's own computation, from two scrapes with
# traffic between, gives figures: what render.py draws the README's picture with.
from __future__ import annotations

import math
import socket
import urllib.request
from pathlib import Path

from contrib.grafana.panels import (
    PANELS,
    Samples,
    dashboard_json,
    metric_names,
    quantile,
    samples_of,
)

from .conftest import DaemonProcess, snapshot
from .waiting import until

HERE = Path(__file__).resolve().parent.parent / "contrib" / "grafana"


def _scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
        return samples_of(reply.read().decode())


def test_the_dashboard_file_is_the_one_the_panels_make() -> None:
    assert (HERE / "sessionstore.json").read_text() == dashboard_json(), (
        "run: .venv/bin/python -m contrib.grafana.render"
    )


def test_quantiles_are_prometheus_histogram_quantile() -> None:
    buckets = {0.1: 10.0, 0.5: 60.0, 1.0: 100.0, math.inf: 100.0}
    assert quantile(0.5, buckets) == 0.1 + 0.4 * (50 - 10) / 50
    assert quantile(0.99, buckets) == 0.5 + 0.5 * (99 - 60) / 40
    assert math.isnan(quantile(0.5, {math.inf: 0.0}))


def test_every_panel_reads_metrics_the_daemon_serves(daemon: DaemonProcess, backend: str) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    daemon.start("--metrics-listen", f"127.0.0.1:{port}")
    before = _scrape(port)
    with daemon.client() as client:
        for n in range(20):
            client.save(snapshot("dash", n=n))
    until(lambda: PANELS[0].compute(before, _scrape(port), 1.0)["save"] >= 20, "the saves counted")
    after = _scrape(port)
    served = {name for name, _ in after}
    about = {"log": "postgresql", "postgresql": "log_live"}  # what the other engine has alone
    for name in metric_names():
        if about[backend] not in name:
            assert name in served, name
    for panel in PANELS:
        figures = panel.compute(before, after, 1.0)
        assert all(isinstance(v, float | int) for v in figures.values()), panel.title
    requests = PANELS[0].compute(before, after, 1.0)
    assert requests["save"] >= 20
