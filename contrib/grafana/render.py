# The dashboard's picture, rendered from a real daemon's metrics with the same
# panels (panels.py) rather than from a Grafana: a daemon on the log with
# --metrics-listen, driven for PHASES (more clients each phase, a few bad
# requests, a watcher, connections turned away), scraped every SCRAPE_S
# seconds; each panel's figure is computed from consecutive scrapes as its
# PromQL would compute it, and drawn with matplotlib. Also writes
# sessionstore.json, the Grafana dashboard.
#
#   .venv/bin/python -m contrib.grafana.render [--out docs/dashboard.png]
from __future__ import annotations

import argparse
import contextlib
import itertools
import socket
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from bench.__main__ import Daemon
from bench.load import run_clients
from sessionstore.client import Client
from sessionstore.errors import SessionStoreError

from .panels import PANELS, Samples, dashboard_json, samples_of

PHASES = ((1, 15.0), (16, 15.0), (64, 15.0), (8, 15.0))  # (clients saving, seconds)
SCRAPE_S = 2.0
HERE = Path(__file__).resolve().parent


def _scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
        return samples_of(reply.read().decode())


def _drive(socket_path: str, stop: threading.Event) -> None:
    for clients, seconds in PHASES:
        run_clients(socket_path, "save", clients, 4096, seconds, f"phase-{clients}")
    stop.set()


def _nuisance(daemon: Daemon, stop: threading.Event) -> None:
    """A bad request and a refused connection now and then, and a watcher throughout."""
    watcher = Client(daemon.socket, timeout=None)
    events = watcher.watch()
    threading.Thread(target=lambda: [None for _ in events], daemon=True).start()
    while not stop.wait(3.0):
        with Client(daemon.socket) as client, contextlib.suppress(SessionStoreError):
            client.call("load")  # no session_id


def render(out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="dashboard-") as workdir:
        daemon = Daemon(Path(workdir), "--metrics-listen", f"127.0.0.1:{port}")
        stop = threading.Event()
        scrapes: list[tuple[float, Samples]] = [(time.monotonic(), _scrape(port))]
        threading.Thread(target=_drive, args=(daemon.socket, stop)).start()
        threading.Thread(target=_nuisance, args=(daemon, stop), daemon=True).start()
        while not stop.wait(SCRAPE_S):
            scrapes.append((time.monotonic(), _scrape(port)))
        daemon.stop()
    start = scrapes[0][0]
    figure, axes = plt.subplots(3, 3, figsize=(15, 9), constrained_layout=True)
    for axis, panel in zip(axes.flat, PANELS, strict=True):
        lines: dict[str, tuple[list[float], list[float]]] = {}
        for (t0, before), (t1, after) in itertools.pairwise(scrapes):
            for legend, value in panel.compute(before, after, t1 - t0).items():
                xs, ys = lines.setdefault(legend or "-", ([], []))
                xs.append(t1 - start)
                ys.append(value)
        for legend, (xs, ys) in sorted(lines.items()):
            axis.plot(xs, ys, label=legend)
        axis.set_title(panel.title, fontsize=10)
        axis.set_xlabel("seconds", fontsize=8)
        axis.tick_params(labelsize=8)
        if lines:
            axis.legend(fontsize=7, loc="upper left")
        else:
            axis.text(0.5, 0.5, "no data (PostgreSQL only)", ha="center", transform=axis.transAxes)
    figure.suptitle(
        "sessionstore: the dashboard's panels, computed from a daemon's /metrics "
        f"(clients saving 4 KiB: {', '.join(str(c) for c, _ in PHASES)})",
        fontsize=11,
    )
    figure.savefig(out, dpi=80)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m contrib.grafana.render")
    parser.add_argument("--out", default="docs/dashboard.png")
    args = parser.parse_args()
    (HERE / "sessionstore.json").write_text(dashboard_json())
    render(Path(args.out))
    print(f"wrote {HERE / 'sessionstore.json'} and {args.out}")


if __name__ == "__main__":
    main()
