# How CBOR values appear in JSON lines (the debug mode, the CLI), both ways.
#
# JSON has text keys, finite numbers and no byte strings; CBOR has all three.
# Every value a store can hold has exactly one JSON form, and reading that form
# back gives the same value, so the same canonical bytes and the same digest:
#   - a byte string is {"$bytes": "<base64>"};
#   - NaN, Infinity and -Infinity are {"$float": "NaN"}, {"$float": "Infinity"},
#     {"$float": "-Infinity"} (JSON's own number forms cannot hold them; the
#     bare NaN/Infinity tokens some parsers accept are refused);
#   - a map with a key that is not text is {"$map": [[key, value], ...]}, its
#     keys in their JSON forms (an array key is a JSON array, a map key a map);
#   - a text map whose only key is "$bytes", "$float" or "$map" is written as a
#     "$map" too, so a wrapper and a map that looks like one never meet;
#   - floats keep a fraction or exponent ("1.0"), so they stay floats.
# Integers outside CBOR's 64-bit range (they would need bignum tags, which the
# daemon refuses) are refused when read.
from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

import cbor2

CBOR_INT_MIN, CBOR_INT_MAX = -(2**64), 2**64 - 1  # major types 0 and 1; beyond: bignum tags
WRAPPERS = frozenset({"$bytes", "$float", "$map"})
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


class NoJSONForm(ValueError):
    pass


def _float_form(value: float) -> Any:
    if math.isnan(value):
        return {"$float": "NaN"}
    if math.isinf(value):
        return {"$float": "Infinity" if value > 0 else "-Infinity"}
    return value


def to_json_value(value: Any) -> Any:
    """The JSON form of a decoded CBOR value (cbor2's tuples and frozendicts included)."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is float:
        return _float_form(value)
    if isinstance(value, str):  # a str subclass (an ErrorCode)
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, Mapping):
        if all(type(key) is str for key in value) and not (
            len(value) == 1 and next(iter(value)) in WRAPPERS
        ):
            return {key: to_json_value(item) for key, item in value.items()}
        return {"$map": [[to_json_value(k), to_json_value(v)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return [to_json_value(item) for item in value]
    raw = getattr(value, "data", None)
    if isinstance(raw, bytes):  # protocol.RawCBOR: an encoded item spliced into a reply
        return to_json_value(cbor2.loads(raw))
    raise NoJSONForm(f"a {kind.__name__} has no JSON form")


def _from_wrapper(name: str, body: Any) -> Any:
    if name == "$bytes":
        if not isinstance(body, str):
            raise ValueError("$bytes takes base64 text")
        try:
            return base64.b64decode(body, validate=True)
        except binascii.Error as error:
            raise ValueError(f"bad $bytes value: {error}") from None
    if name == "$float":
        if body not in _NON_FINITE:
            raise ValueError('$float takes "NaN", "Infinity" or "-Infinity"')
        return _NON_FINITE[body]
    if not isinstance(body, list) or not all(
        isinstance(pair, list) and len(pair) == 2 for pair in body
    ):
        raise ValueError("$map takes a list of [key, value] pairs")
    out = {}
    for key, item in body:
        hashable = _as_key(from_json_value(key))
        if hashable in out:
            raise ValueError(f"$map repeats the key {key!r}")
        out[hashable] = from_json_value(item)
    return out


def _as_key(value: Any) -> Any:
    """A decoded value in the hashable form cbor2 gives a map key."""
    if isinstance(value, list):
        return tuple(_as_key(item) for item in value)
    if isinstance(value, dict):
        return cbor2.frozendict({k: _as_key(v) for k, v in value.items()})
    return value


def from_json_value(value: Any) -> Any:
    """The CBOR value a JSON form stands for; ValueError when it stands for none."""
    if isinstance(value, dict):
        if len(value) == 1:
            name = next(iter(value))
            if name in WRAPPERS:
                return _from_wrapper(name, value[name])
        return {k: from_json_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_json_value(v) for v in value]
    if type(value) is int and not CBOR_INT_MIN <= value <= CBOR_INT_MAX:
        raise ValueError(f"integer {value} is outside CBOR's range (tags are refused)")
    return value


def containers_deep(value: Any) -> int:
    """How many maps and arrays nest in value, at most (0 for a scalar); no recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Iterable[Any] = [*item.keys(), *item.values()]
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _refuse_constant(name: str) -> Any:
    raise ValueError(f'{name} is not JSON; write {{"$float": "{name}"}}')


# the longest integer literal CBOR holds: "-18446744073709551616"
INT_LITERAL_MAX_CHARS = len(str(CBOR_INT_MIN))


def _parse_int(literal: str) -> int:
    if len(literal) > INT_LITERAL_MAX_CHARS:  # before int(), which is quadratic in digits
        raise ValueError(f"integer {literal[:24]}... is outside CBOR's range (tags are refused)")
    return int(literal)


def _parse_float(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):
        raise ValueError(f"number {literal[:24]} is beyond a 64-bit float's range")
    return value


def loads(text: str | bytes) -> Any:
    """Strict JSON: the NaN and Infinity tokens are refused (see "$float"), and so are
    numbers no CBOR item holds (an integer beyond 64 bits, a float beyond its range)."""
    return json.loads(
        text, parse_constant=_refuse_constant, parse_int=_parse_int, parse_float=_parse_float
    )


# Every character some reader of JSON lines takes for a line end: str.splitlines()
# splits on all of them, JavaScript before ES2019 and several log shippers on
# U+2028 and U+2029. json.dumps escapes those below U+0020 itself; with
# ensure_ascii=False it leaves U+0085, U+2028 and U+2029 raw, valid JSON that
# such a reader cuts in two. They can only stand inside strings, so an escape is
# always the same text.
_LINE_ENDS = [0x0A, 0x0B, 0x0C, 0x0D, 0x1C, 0x1D, 0x1E, 0x85, 0x2028, 0x2029]
_ESCAPED_LINE_ENDS = {code: f"\\u{code:04x}" for code in _LINE_ENDS}


def json_line(value: Any) -> str:
    """value (already in its JSON form) as one line of JSON for every reader: UTF-8
    text kept as it is, line ends escaped."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False).translate(_ESCAPED_LINE_ENDS)


def dumps(value: Any) -> str:
    return json.dumps(to_json_value(value), separators=(",", ":"), allow_nan=False)
