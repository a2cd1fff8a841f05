# Immutable records on the request path, as cheap to build as plain ones.
#
# A frozen dataclass guards every field against assignment at run time: its
# __init__ sets each field through object.__setattr__, 0.87 us for seven fields
# here against 0.18 for a dataclass with slots and no guard. A save builds about
# six such records on its way (the request, the document, the mutation, its
# outcome, the logged document) and at 64 clients that was 7-9 us of a save's CPU
# (bench.cpu, alternating runs). value_class builds them without the guard, and
# declares them frozen to the type checker (PEP 681's frozen_default): mypy refuses
# an assignment to a field, where the frozen dataclass raised at run time. Equality
# and hashing are by value, as a frozen dataclass's are.
from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar, dataclass_transform

T = TypeVar("T")


@dataclass_transform(frozen_default=True)
def value_class(cls: type[T]) -> type[T]:
    return dataclass(slots=True, unsafe_hash=True)(cls)
