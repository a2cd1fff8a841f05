# The dashboard's picture, rendered from a real daemon's metrics with the same
# panels (panels.py) rather than from a Grafana: a daemon on the log with
# --metrics-listen, driven for PHASES (more clients each phase, a watcher, and
# once BAD_REQUESTS bad requests, so that the errors panel shows them), scraped
# every SCRAPE_S seconds; each panel's figure is computed from consecutive scrapes as its
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
BAD_REQUESTS = 20  # sent once, 20 s in
BAD_REQUESTS_AT_S = 20.0
# Grafana's unit ids, as the axes say them
UNIT_LABELS = {"reqps": "requests / s", "s": "seconds", "short": "count", "bytes": "bytes"}
HERE = Path(__file__).resolve().parent


def _scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
        return samples_of(reply.read().decode())


def _drive(socket_path: str, stop: threading.Event) -> None:
    for clients, seconds in PHASES:
        run_clients(socket_path, "save", clients, 4096, seconds, f"phase-{clients}")
    stop.set()


def _nuisance(daemon: Daemon, stop: threading.Event) -> None:
    """A watcher throughout, and one burst of bad requests."""
    watcher = Client(daemon.socket, timeout=None)
    events = watcher.watch()
    threading.Thread(target=lambda: [None for _ in events], daemon=True).start()
    if stop.wait(BAD_REQUESTS_AT_S):
        return
    with Client(daemon.socket) as client:
        for _ in range(BAD_REQUESTS):
            with contextlib.suppress(SessionStoreError):
                client.call("load")  # no session_id: bad_request


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
    rows = -(-len(PANELS) // 2)
    figure, axes = plt.subplots(rows, 2, figsize=(11, 3.2 * rows), constrained_layout=True)
    for axis in axes.flat[len(PANELS) :]:
        axis.set_visible(False)
    for axis, panel in zip(axes.flat, PANELS, strict=False):
        lines: dict[str, tuple[list[float], list[float]]] = {}
        for (t0, before), (t1, after) in itertools.pairwise(scrapes):
            for legend, value in panel.compute(before, after, t1 - t0).items():
                xs, ys = lines.setdefault(legend or "-", ([], []))
                xs.append(t1 - start)
                ys.append(value)
        for legend, (xs, ys) in sorted(lines.items()):
            axis.plot(xs, ys, label=legend)
        axis.set_title(panel.title, fontsize=13)
        axis.set_xlabel("seconds", fontsize=11)
        axis.set_ylabel(UNIT_LABELS.get(panel.unit, panel.unit), fontsize=11)
        axis.tick_params(labelsize=10)
        if lines:
            axis.legend(fontsize=9, loc="upper left")
        else:
            axis.text(0.5, 0.5, "no data (PostgreSQL only)", ha="center", transform=axis.transAxes)
    figure.suptitle(
        "The dashboard's panels, from a daemon's /metrics\n"
        f"clients saving 4 KiB: {', '.join(str(c) for c, _ in PHASES)}, "
        f"{PHASES[0][1]:.0f} s each; {BAD_REQUESTS} bad requests at {BAD_REQUESTS_AT_S:.0f} s",
        fontsize=13,
    )
    figure.savefig(out, dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m contrib.grafana.render")
    parser.add_argument("--out", default="docs/dashboard.png")
    args = parser.parse_args()
    (HERE / "sessionstore.json").write_text(dashboard_json())
    render(Path(args.out))
    print(f"wrote {HERE / 'sessionstore.json'} and {args.out}")


if __name__ == "__main__":
    main()
