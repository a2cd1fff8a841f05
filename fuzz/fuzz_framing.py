# atheris harness for the framing code: `make fuzz` (FUZZ_SECONDS=600). With the
# compiled CBOR helper built, the daemon's connections take the byte path
# (byte_path.py), and each input also goes through the helper and its Python
# twin, which must agree.
# Any bytes, cut anywhere, must give the same messages whole or in pieces, or a
# classified Refusal; every message decoded must encode again in the
# connection's mode (a reply carrying it never fails). Each input is tried as
# CBOR and, with a "{" in front, as JSON lines. Anything else (an exception, a
# hang) is a finding.
from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from sessionstore.wire import cbor_bytes_python
    from sessionstore.wire.protocol import (
        END_OF_STREAM,
        NEED_DATA,
        Connection,
        Refusal,
        parse_request,
    )

MAX_MESSAGE_BYTES = 1 << 16


def _messages(chunks: list[bytes], order_maps: bool) -> list[object]:
    conn = Connection(max_message_bytes=MAX_MESSAGE_BYTES, order_maps=order_maps)
    out: list[object] = []
    for chunk in [*chunks, None]:
        if chunk is None:
            conn.receive_eof()
        else:
            conn.receive_data(chunk)
        while True:
            try:
                message = conn.next_message()
            except Refusal as error:
                assert error.code in ("bad_request", "too_large"), error.code
                out.append(("error", error.code))  # the code must agree; wording may differ
                if error.fatal:
                    return out
                continue
            if message is NEED_DATA or message is END_OF_STREAM:
                break
            try:
                parse_request(message)
            except Refusal as error:
                assert error.code == "bad_request" and not error.fatal
            conn.encode({"ok": True, "echo": message})
            out.append(message)
    return out


try:
    from sessionstore.wire import _cbor_bytes as compiled  # type: ignore[attr-defined]
except ImportError:
    compiled = None


def _helper_agrees_with_its_twin(payload: bytes, depth: int) -> None:
    if compiled is None:
        return
    walk = (payload, 0, len(payload) + 1, depth, 1 << 20)
    assert compiled.walk(*walk) == cbor_bytes_python.walk(*walk)
    assert compiled.canonicalise(payload, 0, len(payload), depth) == (
        cbor_bytes_python.canonicalise(payload, 0, len(payload), depth)
    )


def test_one_input(data: bytes) -> None:
    provider = atheris.FuzzedDataProvider(data)
    cut = provider.ConsumeIntInRange(0, 64)
    depth = provider.ConsumeIntInRange(0, 70)
    payload = provider.ConsumeBytes(provider.remaining_bytes())
    _helper_agrees_with_its_twin(payload, depth)
    for framed in (payload, b"{" + payload):  # CBOR (unless it starts with "{"), JSON lines
        whole = _messages([framed], order_maps=True)
        if cut:
            pieces = [framed[i : i + cut] for i in range(0, len(framed), cut)]
            # repr: a NaN decoded twice is two unequal floats, but the same text
            assert repr(_messages(pieces, order_maps=True)) == repr(whole)


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
