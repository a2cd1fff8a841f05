# The CPU a save costs the daemon before the disk, in-process and without the
# socket: the steps every save must take in Python (decode the request into
# objects, validate the snapshot, produce its canonical bytes, hash them), each
# timed alone, and cbor2's bare decode and encode as the floor under them. The
# throughput targets set a CPU budget per save (two cores shared with the
# clients); this shows how much of it these steps alone take.
from __future__ import annotations

import cbor2

from sessionstore.wire.canonical import canonical_dumps, digest_bytes_of_canonical
from sessionstore.wire.protocol import Connection, Mode, Request, parse_request
from sessionstored.ops.snapshot import validate_snapshot

from .sealing_cost import per_call_us
from .workload import make_snapshot

ROUNDS = 2_000


def _count_items(value: object) -> int:
    if isinstance(value, dict):
        return 1 + sum(_count_items(k) + _count_items(v) for k, v in value.items())
    if isinstance(value, list):
        return 1 + sum(_count_items(v) for v in value)
    return 1


def _daemon_connection() -> Connection:
    return Connection(
        max_message_bytes=1 << 30, mode=Mode.CBOR, received="request", order_maps=True
    )


def _decode_as_the_daemon_does(conn: Connection, frame: bytes) -> Request:
    """One request through a connection that lives on, as the daemon's do."""
    conn.receive_data(frame)
    return parse_request(conn.next_message(), canonical_hint=conn.last_hint)


def frontend_cost(size: int) -> dict[str, float]:
    snapshot = make_snapshot("s0", size)
    body = canonical_dumps(snapshot)
    frame = cbor2.dumps({"op": "save", "snapshot": snapshot}, canonical=True)
    conn = _daemon_connection()
    request = _decode_as_the_daemon_does(conn, frame)
    hint = request.canonical_hint
    steps = {
        "cbor2_loads_floor_us": per_call_us(lambda: cbor2.loads(frame), ROUNDS),
        "cbor2_dumps_floor_us": per_call_us(lambda: cbor2.dumps(snapshot), ROUNDS),
        "decode_request_us": per_call_us(lambda: _decode_as_the_daemon_does(conn, frame), ROUNDS),
        "validate_snapshot_us": per_call_us(lambda: validate_snapshot(snapshot), ROUNDS),
        "canonical_body_us": per_call_us(lambda: canonical_dumps(snapshot, hint=hint), ROUNDS),
        "digest_us": per_call_us(lambda: digest_bytes_of_canonical(body), ROUNDS),
    }
    steps["sum_of_steps_us"] = sum(
        steps[name]
        for name in ("decode_request_us", "validate_snapshot_us", "canonical_body_us", "digest_us")
    )
    return {"cbor_items": float(_count_items(snapshot)), **steps}
