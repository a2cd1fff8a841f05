# Two real daemons that differ in one compiled part: one on the compiled CBOR helper
# and one on its pure-Python twin (SESSIONSTORE_CBOR_HELPER=python); then one on the
# request path compiled by mypyc and one on the same source interpreted
# (SESSIONSTORE_BUILD=interpreted). The same requests, sent as raw bytes in every form
# (canonical, plain, loose, malformed, cut into pieces), get the same replies, and
# what they store reads back byte for byte the same.
from __future__ import annotations

import itertools
import random
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cbor2
import pytest

from sessionstore import build
from sessionstore.wire.canonical import canonical_dumps
from sessionstore.wire.protocol import NEED_DATA, Connection, Mode

from . import cbor_reference as reference
from .conftest import DaemonProcess

pytestmark = pytest.mark.log_only


# the part, as hello and stats name it; its environment variable; its compiled and
# its interpreted value
PARTS = {
    "cbor_helper": ("SESSIONSTORE_CBOR_HELPER", "compiled", "python"),
    "build": ("SESSIONSTORE_BUILD", "compiled", "interpreted"),
}


@pytest.fixture(params=sorted(PARTS))
def both(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, dict[str, DaemonProcess]]]:
    part = request.param
    variable, *paths = PARTS[part]
    if part == "build" and not build.compiled_available("sessionstored"):
        pytest.skip("the request path is not compiled here (no C compiler, or not built)")
    daemons = {}
    for path in paths:
        daemon = DaemonProcess(Path(tmp_path_factory.mktemp(path, numbered=True)))
        daemon.start(env={variable: path})
        daemons[path] = daemon
    yield part, daemons
    for daemon in daemons.values():
        assert daemon.stop() == 0, daemon.log()
        daemon.cleanup()


def _snapshot(session_id: str, rng: random.Random) -> dict[str, Any]:
    events = [
        {"sequence": n, "kind": rng.choice(["tool", "note"]), "took_s": rng.random() * 10}
        for n in range(rng.randrange(1, 40))
    ]
    return {
        "session": {"id": session_id, "config": {"workspace": "/w", "temperature": 0.5}},
        "schema_version": 1,
        "trace_events": events,
        "run_records": [{"snapshot": {"id": "r1", "event_count": 99}, "events": events[:3]}],
        "artifacts": [{"uri": "file:///a", "bytes": b"\x00\x01"}],
        "retained_artifact_uris": ["file:///a"],
    }


def _requests(rng: random.Random) -> list[bytes]:
    """Raw request bytes: good ones in three encodings, refused ones, malformed ones."""
    out = []
    for n in range(6):
        save = {"op": "save", "rid": n, "snapshot": _snapshot(f"s{n}", rng)}
        out.append(reference.encode(save))  # canonical
        out.append(cbor2.dumps(save))  # plain: keys in insertion order, doubles
        out.append(reference.loose_encode(save, rng))  # wide heads, indefinite lengths
        value = {"run_id": f"k{n}", "state": {"b": [1.5, None], "a": "x" * n}}
        put = {"op": "checkpoint_put", "rid": n, "kind": "loop", "key": f"k{n}", "value": value}
        out.append(cbor2.dumps(put))
        out.append(reference.encode({**put, "value": {**value, "run_id": "other"}}))
    bad_snapshot = _snapshot("bad", rng)
    bad_snapshot["run_records"] *= 2  # the same run id twice
    out.append(reference.encode({"op": "save", "rid": "dup", "snapshot": bad_snapshot}))
    out.append(reference.encode({"op": "save", "rid": "arr", "snapshot": [1]}))
    out.append(reference.encode({"op": "save", "rid": "nosession", "snapshot": {"a": 1}}))
    out.append(bytes.fromhex("a3626f706473617665637269646374616768736e617073686f74c100"))  # a tag
    return out


MALFORMED = [
    bytes.fromhex("a2626f706470696e676178") + b"\x62\xc3\x28",  # bad UTF-8
    bytes.fromhex("a2626f706470696e67617818"),  # non-shortest head, then cut short
    bytes.fromhex("a2626f706470696e676178f7"),  # undefined
    bytes.fromhex("a2626f706470696e6761781c"),  # reserved
    bytes.fromhex("a2626f706470696e67626f706470696e67"),  # the key "op" twice
]


def _exchange(path: str, data: bytes, pieces: int) -> list[Any]:
    """Send data in pieces and read replies until the daemon closes or answers all."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(path)
        sock.settimeout(20)
        cut = [len(data) * i // pieces for i in range(pieces + 1)]
        for start, end in itertools.pairwise(cut):
            sock.sendall(data[start:end])
        sock.shutdown(socket.SHUT_WR)
        conn = Connection(max_message_bytes=1 << 26, mode=Mode.CBOR)
        replies = []
        while True:
            message = conn.next_message()
            if message is NEED_DATA:
                chunk = sock.recv(65536)
                if not chunk:
                    return replies
                conn.receive_data(chunk)
                continue
            replies.append(message)


def _stored(daemon: DaemonProcess) -> dict[str, Any]:
    with daemon.client() as client:
        sessions = {sid: canonical_dumps(client.load(sid)) for sid in client.list()["ids"]}
        keys = [f"k{n}" for n in range(6)]
        checkpoints = {key: client.checkpoint_get("loop", key) for key in keys}
        heads = {sid: client.head(sid)["digest"] for sid in sessions}
    return {"sessions": sessions, "checkpoints": checkpoints, "heads": heads}


def test_both_paths_answer_and_store_the_same(
    both: tuple[str, dict[str, DaemonProcess]],
) -> None:
    part, daemons = both
    compiled, interpreted = daemons
    requests = _requests(random.Random(22))
    replies: dict[str, list[Any]] = {}
    for path, daemon in daemons.items():
        with daemon.client() as client:
            assert client.hello()[part] == path
            assert client.stats()[part] == path
        replies[path] = [_exchange(daemon.socket_path, b"".join(requests), pieces=7)]
        for pieces in (1, 3):
            replies[path] += [_exchange(daemon.socket_path, bad, pieces) for bad in MALFORMED]
    assert replies[compiled] == replies[interpreted]
    answered = replies[compiled][0]
    assert len(answered) == len(requests)
    assert sum(reply["ok"] for reply in answered) == 24  # 18 saves, 6 puts
    assert all(len(batch) == 1 and not batch[0]["ok"] for batch in replies[compiled][1:])
    stored = {path: _stored(daemon) for path, daemon in daemons.items()}
    assert stored[compiled] == stored[interpreted]
    assert len(stored[compiled]["sessions"]) == 6
