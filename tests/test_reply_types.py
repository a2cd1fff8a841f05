# Every op method's declared reply type (reply_types.py) against what a real daemon
# sends, on both engines: each required field there, no field the type does not
# name, each value of its declared type. And the async clients' op methods are the
# blocking one's, generated (dev/generate_async_op_methods.py), with the same types.
from __future__ import annotations

import inspect
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any

from sessionstore import Client
from sessionstore.async_op_methods import AsyncOpMethods
from sessionstore.op_methods import OpMethods
from sessionstore.reply_types import Stats

from .conftest import DaemonProcess, snapshot

ROOT = Path(__file__).resolve().parent.parent
OPEN = {Stats}  # each engine adds fields of its own to these


def _problems(value: Any, declared: Any, where: str) -> list[str]:
    origin = typing.get_origin(declared)
    if declared is Any:
        return []
    if declared is None or declared is type(None):
        return [] if value is None else [f"{where}: {value!r} is not None"]
    if origin in (typing.Union, types.UnionType):
        options = [_problems(value, option, where) for option in typing.get_args(declared)]
        return [] if any(not found for found in options) else min(options, key=len)
    if typing.is_typeddict(declared):
        if not isinstance(value, dict):
            return [f"{where}: {value!r} is not a map"]
        hints = typing.get_type_hints(declared)
        missing = declared.__required_keys__ - set(value)
        unknown = set() if declared in OPEN else set(value) - set(hints)
        found = [f"{where}: {sorted(missing)} missing" for _ in [1] if missing]
        found += [f"{where}: {sorted(unknown)} not declared" for _ in [1] if unknown]
        for key in set(value) & set(hints):
            found += _problems(value[key], hints[key], f"{where}.{key}")
        return found
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: {value!r} is not a list"]
        (item,) = typing.get_args(declared)
        return [p for i, v in enumerate(value) for p in _problems(v, item, f"{where}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{where}: {value!r} is not a map"]
        _, item = typing.get_args(declared)
        return [p for k, v in value.items() for p in _problems(v, item, f"{where}.{k}")]
    if declared is float:
        return [] if isinstance(value, int | float) else [f"{where}: {value!r} is not a number"]
    if declared is int and isinstance(value, bool):
        return [f"{where}: {value!r} is a bool"]
    return [] if isinstance(value, declared) else [f"{where}: {value!r} is not {declared}"]


def _declared(name: str) -> Any:
    return typing.get_type_hints(getattr(OpMethods, name))["return"]


def test_every_reply_has_its_declared_type(running: DaemonProcess) -> None:
    vector = [1.0, 0.0]
    with Client(running.socket_path) as client:
        lease = client.lease_acquire("me")
        replies: list[tuple[str, Any]] = [
            ("hello", client.hello()),
            ("ping", client.ping()),
            ("save", client.save(snapshot("r1"), lease=lease, ttl_s=100)),
            ("save", client.save(snapshot("r1"), lease=lease)),
            ("load", client.load("r1")),
            ("load", client.load("none")),
            ("load_with_meta", client.load_with_meta("r1")),
            ("load_with_meta", client.load_with_meta("r1", at=2)),
            ("load_with_meta", client.load_with_meta("none")),
            ("history", client.history("r1")),
            ("revert", client.revert("r1", 2, lease=lease)),
            ("head", client.head("r1")),
            ("head", client.head("none")),
            ("exists", client.exists("r1")),
            ("list", client.list()),
            ("update", client.update("r1", "artifacts", [{"k": 1}], lease=lease)),
            ("fork", client.fork("r1", "r2", "/w", lease=lease)),
            ("delete", client.delete("r2", lease=lease)),
            ("delete", client.delete("r2", lease=lease)),
            ("checkpoint_put", client.checkpoint_put("kv", "k", {"vectors": vector}, lease=lease)),
            ("checkpoint_put", client.checkpoint_put("kv", "j", {"v": 1}, lease=lease, ttl_s=60)),
            ("checkpoint_get", client.checkpoint_get("kv", "k")),
            ("checkpoint_get", client.checkpoint_get("kv", "none")),
            ("checkpoint_scan", client.checkpoint_scan("kv")),
            ("checkpoint_scan", client.checkpoint_scan("kv", values=False)),
            ("checkpoint_rank", client.checkpoint_rank("kv", "", vector)),
            ("expire", client.expire("r1", 30, lease=lease)),
            ("expire", client.expire("r1", None, lease=lease)),
            ("expire", client.expire("none", 30, lease=lease)),
            ("checkpoint_delete", client.checkpoint_delete("kv", "j", lease=lease)),
            (
                "txn",
                client.txn([{"op": "put", "kind": "kv", "key": "t", "value": {}}], lease=lease),
            ),
            ("lease_get", client.lease_get()),
            ("lease_release", client.lease_release("me", lease["epoch"])),
            ("lease_get", client.lease_get()),
            ("lease_acquire", lease),
            ("stats", client.stats()),
            ("verify", client.verify()),
            ("compact", client.compact()),
        ]
    checked = {name for name, _ in replies}
    every_op = {
        name
        for name, member in inspect.getmembers(OpMethods, inspect.isfunction)
        if not name.startswith("_") and name not in {"call", "pipeline"}
    }
    assert checked == every_op
    for name, reply in replies:
        assert _problems(reply, _declared(name), name) == []


def test_the_checker_finds_a_wrong_reply() -> None:
    assert _problems({"digest": "x"}, _declared("save"), "save") == ["save: ['seq'] missing"]
    assert _problems({"digest": "x", "seq": 1, "z": 0}, _declared("save"), "s") == [
        "s: ['z'] not declared"
    ]
    assert _problems({"digest": 1, "seq": True}, _declared("save"), "s") != []
    assert _problems([{"seq": "1"}], _declared("history"), "h") != []


def test_the_async_op_methods_are_generated_from_the_blocking_ones() -> None:
    check = [sys.executable, str(ROOT / "dev" / "generate_async_op_methods.py"), "--check"]
    assert subprocess.run(check, capture_output=True, text=True).returncode == 0
    for name, method in inspect.getmembers(OpMethods, inspect.isfunction):
        twin = getattr(AsyncOpMethods, name)
        assert inspect.iscoroutinefunction(twin), name
        assert typing.get_type_hints(twin) == typing.get_type_hints(method), name
