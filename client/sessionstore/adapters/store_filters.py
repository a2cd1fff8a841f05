# SessionStoreStore's filters, compared as InMemoryStore compares them: a value's
# key or dotted path, operators ($eq, $ne, $gt, ...), and an order comparison of
# two non-numbers is false. Namespace conditions as list_namespaces takes them.
from __future__ import annotations

from typing import Any

from langgraph.store.base import MatchCondition

ORDER_OPERATORS = {
    "$gt": lambda a, b: a > b,
    "$gte": lambda a, b: a >= b,
    "$lt": lambda a, b: a < b,
    "$lte": lambda a, b: a <= b,
}


def matches(value: dict[str, Any], filter: dict[str, Any] | None) -> bool:
    return not filter or all(_compare(_at(value, k), wanted) for k, wanted in filter.items())


def _at(value: dict[str, Any], key: str) -> Any:
    """The value at a filter's key: the key itself, else a dotted path into nested maps
    ("user.level"), as LangGraph's newer InMemoryStore reads one."""
    if key in value or "." not in key:
        return value.get(key)
    found: Any = value
    for part in key.split("."):
        if not isinstance(found, dict):
            return None
        found = found.get(part)
    return found


def _compare(value: Any, wanted: Any) -> bool:
    if isinstance(wanted, dict):
        if any(str(k).startswith("$") for k in wanted):
            return all(_operator(value, name, operand) for name, operand in wanted.items())
        return isinstance(value, dict) and all(_compare(value.get(k), w) for k, w in wanted.items())
    if isinstance(wanted, list | tuple):
        return (
            isinstance(value, list | tuple)
            and len(value) == len(wanted)
            and all(_compare(v, w) for v, w in zip(value, wanted, strict=True))
        )
    return bool(value == wanted)


def _operator(value: Any, name: str, operand: Any) -> bool:
    if name == "$eq":
        return bool(value == operand)
    if name == "$ne":
        return bool(value != operand)
    if name in ORDER_OPERATORS:
        number, bound = _number(value), _number(operand)
        return number is not None and bound is not None and ORDER_OPERATORS[name](number, bound)
    raise ValueError(f"Unsupported operator: {name}")


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def matches_condition(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    part = namespace[: len(path)] if condition.match_type == "prefix" else namespace[-len(path) :]
    if not path:
        return True
    return all(want == "*" or want == label for want, label in zip(path, part, strict=True))
