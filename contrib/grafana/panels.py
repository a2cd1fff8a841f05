# The dashboard's panels, once: each with its PromQL (what Grafana runs) and
# the same figure computed in Python from two scrapes of /metrics (what
# render.py plots when no Grafana is at hand). dashboard() is the Grafana
# JSON model that sessionstore.json holds; tests/test_dashboard.py checks that
# the file is this, and that every metric it names is one the daemon serves.
from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]  # (name, labels) -> value
Series = dict[str, float]  # legend -> value


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    targets: tuple[tuple[str, str], ...]  # (PromQL, legend format)
    compute: Callable[[Samples, Samples, float], Series]


def samples_of(text: str) -> Samples:
    """A /metrics text, parsed by prometheus-client's parser: each sample's value."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _by(samples: Samples, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for (metric, labels), value in samples.items():
        if metric == name:
            key = dict(labels).get(label, "")
            out[key] = out.get(key, 0.0) + value
    return out


def _rate_by(before: Samples, after: Samples, dt: float, name: str, label: str) -> Series:
    old = _by(before, name, label)
    return {k: max(0.0, v - old.get(k, 0.0)) / dt for k, v in _by(after, name, label).items()}


def _gauge(samples: Samples, name: str) -> float:
    return sum(v for (metric, _), v in samples.items() if metric == name)


def quantile(q: float, buckets: dict[float, float]) -> float:
    """Prometheus's histogram_quantile over cumulative bucket counts (le -> count)."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return math.nan
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = bound, count
    return lower


def _quantile_by(q: float, before: Samples, after: Samples, name: str, label: str | None) -> Series:
    grouped: dict[str, dict[float, float]] = {}
    for (metric, labels), value in after.items():
        if metric != f"{name}_bucket":
            continue
        fields = dict(labels)
        key = fields.get(label, "") if label else name
        delta = value - before.get((metric, labels), 0.0)
        le = float(fields["le"])
        grouped.setdefault(key, {})[le] = grouped.setdefault(key, {}).get(le, 0.0) + delta
    return {k: quantile(q, b) for k, b in grouped.items()}


PANELS = (
    Panel(
        "Requests per second, by op", "reqps",
        (("sum by (op) (rate(sessionstore_requests_total[1m]))", "{{op}}"),),
        lambda b, a, dt: _rate_by(b, a, dt, "sessionstore_requests_total", "op"),
    ),
    Panel(
        "Errors per second, by code", "reqps",
        (('sum by (code) (rate(sessionstore_requests_total{code!="ok"}[1m]))', "{{code}}"),),
        lambda b, a, dt: {
            k: v
            for k, v in _rate_by(b, a, dt, "sessionstore_requests_total", "code").items()
            if k != "ok"
        },
    ),
    Panel(
        "Reply time p99, by op", "s",
        (("histogram_quantile(0.99, sum by (op, le) "
          "(rate(sessionstore_request_seconds_bucket[1m])))", "{{op}}"),),
        lambda b, a, dt: _quantile_by(0.99, b, a, "sessionstore_request_seconds", "op"),
    ),
    Panel(
        "Writes per batch (mean)", "short",
        (("rate(sessionstore_batch_size_sum[1m]) / rate(sessionstore_batch_size_count[1m])",
          "writes"),),
        lambda b, a, dt: {"writes": (
            (_gauge(a, "sessionstore_batch_size_sum") - _gauge(b, "sessionstore_batch_size_sum"))
            / max(1.0, _gauge(a, "sessionstore_batch_size_count")
                  - _gauge(b, "sessionstore_batch_size_count"))
        )},
    ),
    Panel(
        "fdatasync p50 and p99", "s",
        (("histogram_quantile(0.5, sum by (le) "
          "(rate(sessionstore_fdatasync_seconds_bucket[1m])))", "p50"),
         ("histogram_quantile(0.99, sum by (le) "
          "(rate(sessionstore_fdatasync_seconds_bucket[1m])))", "p99")),
        lambda b, a, dt: {
            "p50": _quantile_by(0.5, b, a, "sessionstore_fdatasync_seconds", None).get(
                "sessionstore_fdatasync_seconds", math.nan),
            "p99": _quantile_by(0.99, b, a, "sessionstore_fdatasync_seconds", None).get(
                "sessionstore_fdatasync_seconds", math.nan),
        },
    ),
    Panel(
        "The log", "bytes",
        (("sessionstore_log_bytes", "on disk"), ("sessionstore_log_live_bytes", "live")),
        lambda b, a, dt: {"on disk": _gauge(a, "sessionstore_log_bytes"),
                          "live": _gauge(a, "sessionstore_log_live_bytes")},
    ),
    Panel(
        "Watchers", "short",
        (("sessionstore_watchers", "open"),
         ("rate(sessionstore_watchers_lagged_total[1m])", "lagged/s")),
        lambda b, a, dt: {"open": _gauge(a, "sessionstore_watchers"), "lagged/s": (
            _gauge(a, "sessionstore_watchers_lagged_total")
            - _gauge(b, "sessionstore_watchers_lagged_total")) / dt},
    ),
    Panel(
        "Connections, and refusals per second", "short",
        (("sessionstore_connections", "open"),
         ("sum by (reason) (rate(sessionstore_refusals_total[1m]))", "{{reason}}")),
        lambda b, a, dt: {"open": _gauge(a, "sessionstore_connections"),
                          **_rate_by(b, a, dt, "sessionstore_refusals_total", "reason")},
    ),
    Panel(
        "PostgreSQL: follower lag", "short",
        (("sessionstore_postgresql_follower_lag_seqs", "seqs behind"),),
        lambda b, a, dt: {"seqs behind": _gauge(a, "sessionstore_postgresql_follower_lag_seqs")}
        if ("sessionstore_postgresql_follower_lag_seqs", ()) in a
        else {},
    ),
)  # fmt: skip


def metric_names() -> set[str]:
    """The metrics the panels' PromQL names."""
    names: set[str] = set()
    for panel in PANELS:
        for expression, _ in panel.targets:
            names |= set(re.findall(r"\b(sessionstore_[a-z_]+)", expression))
    return names


def dashboard() -> dict[str, Any]:
    panels = []
    for number, panel in enumerate(PANELS):
        panels.append(
            {
                "id": number + 1,
                "type": "timeseries",
                "title": panel.title,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": 8, "x": 8 * (number % 3), "y": 8 * (number // 3)},
                "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
                "targets": [
                    {"refId": chr(ord("A") + n), "expr": expr, "legendFormat": legend}
                    for n, (expr, legend) in enumerate(panel.targets)
                ],
            }
        )
    return {
        "title": "sessionstore",
        "uid": "sessionstore",
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "10s",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "type": "datasource",
                    "query": "prometheus",
                    "label": "Prometheus",
                }
            ]
        },
        "panels": panels,
    }


def dashboard_json() -> str:
    return json.dumps(dashboard(), indent=2, sort_keys=True) + "\n"
