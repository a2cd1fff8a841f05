# Client load for the daemon: C clients spread over several processes (threads
# inside each, blocking sockets) so the client side is not the bottleneck. A
# saving client encodes its snapshot at every save, as users' clients do (the
# anchors encode theirs with json.dumps at every commit), then waits for the
# reply: one save in flight per client. They encode as the sessionstore clients do
# (messages.encode_request: canonical CBOR where the compiled helper is built).
from __future__ import annotations

import multiprocessing
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from threading import Thread
from typing import Any

import cbor2

from sessionstore.wire.messages import encode_request
from sessionstore.wire.protocol import NEED_DATA, Connection, Mode, RawCBOR

from .workload import make_snapshot, snapshot_bytes

CLIENTS_PER_PROCESS = 8


@dataclass
class Sample:
    operations: int
    elapsed_s: float
    latencies_s: list[float]
    errors: int


def _client(
    socket_path: str,
    request: bytes | dict[str, Any],
    start_at: float,
    deadline: float,
    out: list[Any],
) -> None:
    """request: its bytes, sent as they are, or a map that is encoded for every send (as a
    user's client does)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(socket_path)
    conn = Connection(max_message_bytes=1 << 30, mode=Mode.CBOR)
    latencies = []
    errors = 0
    while time.time() < start_at:
        time.sleep(0.001)
    while time.time() < deadline:
        started = time.perf_counter()
        sock.sendall(request if isinstance(request, bytes) else encode_request(request, Mode.CBOR))
        while (message := conn.next_message()) is NEED_DATA:
            conn.receive_data(sock.recv(64 * 1024))
        latencies.append(time.perf_counter() - started)
        if not message.get("ok"):
            errors += 1
    sock.close()
    out.append((latencies, errors))


def _raw(encoder: Any, value: Any) -> None:
    encoder.write(value.data)


def run_clients(
    socket_path: str, op: str, clients: int, size: int, duration_s: float, tag: str
) -> Sample:
    """`clients` clients saving (each its own session) or loading, for duration_s."""
    requests: list[bytes | dict[str, Any]] = []
    for n in range(clients):
        session_id = f"bench/{tag}/{n}"
        if op == "save":  # the snapshot encoded by the client at every save
            requests.append({"op": "save", "snapshot": make_snapshot(session_id, size)})
        else:
            requests.append(cbor2.dumps({"op": "load", "session_id": session_id}))
    return run_fixed(socket_path, requests, duration_s)


Client = Callable[[str, Any, float, float, list[Any]], None]


def _fixed_process(args: tuple[str, list[Any], float, float, Client]) -> tuple[list[float], int]:
    socket_path, requests, start_at, deadline, client = args
    results: list[Any] = []
    threads = [
        Thread(target=client, args=(socket_path, request, start_at, deadline, results))
        for request in requests
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    latencies = [lat for lats, _ in results for lat in lats]
    return latencies, sum(e for _, e in results)


def run_fixed(
    socket_path: str, requests: Sequence[Any], duration_s: float, client: Client = _client
) -> Sample:
    """One client per request, each sending it over and over, for duration_s (bytes as
    they are, a map encoded at every send); client: how one sends (another server's
    protocol, for an anchor)."""
    groups = [
        requests[i : i + CLIENTS_PER_PROCESS] for i in range(0, len(requests), CLIENTS_PER_PROCESS)
    ]
    start_at = time.time() + 0.5 + 0.05 * len(groups)
    deadline = start_at + duration_s
    context = multiprocessing.get_context("fork")
    with context.Pool(len(groups)) as pool:
        results = pool.map(
            _fixed_process,
            [(socket_path, group, start_at, deadline, client) for group in groups],
        )
    latencies = [lat for lats, _ in results for lat in lats]
    return Sample(len(latencies), duration_s, latencies, sum(e for _, e in results))


def run_in_processes(target: Callable[..., Any], argument_sets: list[tuple[Any, ...]]) -> list[Any]:
    context = multiprocessing.get_context("fork")
    with context.Pool(len(argument_sets)) as pool:
        return pool.starmap(target, argument_sets)


def _rewriter(socket_path: str, requests: list[bytes], rounds: int, out: list[int]) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(socket_path)
    conn = Connection(max_message_bytes=1 << 30, mode=Mode.CBOR)
    failed = 0
    for _ in range(rounds):
        for request in requests:
            sock.sendall(request)
            while (message := conn.next_message()) is NEED_DATA:
                conn.receive_data(sock.recv(64 * 1024))
            failed += not message.get("ok")
    sock.close()
    out.append(failed)


def _rewrite_process(args: tuple[str, list[list[str]], int, int]) -> tuple[int, int]:
    socket_path, id_groups, size, rounds = args
    failures: list[int] = []
    threads, saved = [], 0
    for ids in id_groups:
        requests = []
        for session_id in ids:
            body = snapshot_bytes(session_id, size)
            saved += len(body) * rounds
            requests.append(cbor2.dumps({"op": "save", "snapshot": RawCBOR(body)}, default=_raw))
        threads.append(Thread(target=_rewriter, args=(socket_path, requests, rounds, failures)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return saved, sum(failures)


def run_clients_over(socket_path: str, clients: int, sessions: int, rounds: int, size: int) -> int:
    """`clients` connections rewrite `sessions` sessions `rounds` times; bytes saved."""
    ids = [f"space/{n:06d}" for n in range(sessions)]
    per_client = [ids[c::clients] for c in range(clients)]
    groups = [
        per_client[i : i + CLIENTS_PER_PROCESS] for i in range(0, clients, CLIENTS_PER_PROCESS)
    ]
    context = multiprocessing.get_context("fork")
    with context.Pool(len(groups)) as pool:
        results = pool.map(_rewrite_process, [(socket_path, g, size, rounds) for g in groups])
    if any(failed for _, failed in results):
        raise SystemExit(f"bench: {sum(f for _, f in results)} rewrites failed")
    return sum(saved for saved, _ in results)
