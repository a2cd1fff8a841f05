# What AdvancedSessionStoreSession (agents_advanced.py, which says how it keeps a
# session) stands on: its state and key layout, running its plans one at a time per
# instance, reading which branch is current, and what it reads out of items.
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from agents._tool_identity import is_reserved_synthetic_tool_namespace, tool_qualified_name
from agents.memory.session_settings import (
    SessionSettings,
)

from .. import requests as r
from ..asyncio_client import AsyncClient, ClientPerLoop
from ..effects import AsyncLedger, Scope
from ..errors import Conflict
from . import plans
from .agents import settings_of
from .keyparts import key_part
from .lifetime import Items, every_item
from .ownership import LEASE_TTL_S, fenced_txn, owner_of, take_over
from .plans import (
    KIND,
    SCAN_PAGE,
    TXN_OPS,
    Plan,
    put_op,
    socket_of,
)

if TYPE_CHECKING:
    pass

MAIN = "main"
BranchState = tuple[str, int | None]  # (a branch, the clear generation it was read at)
PER_ADD_TXN = TXN_OPS - 1  # the head's put goes with each txn of items
TOOL_CALL_TYPES = frozenset(
    {
        "tool_call", "function_call", "computer_call", "file_search_call", "web_search_call",
        "code_interpreter_call", "tool_search_call", "custom_tool_call", "mcp_call",
        "mcp_approval_request", "shell_call", "apply_patch_call",
    }
)  # fmt: skip
NAMED_BY_TYPE = frozenset(
    {
        "computer_call", "file_search_call", "web_search_call", "code_interpreter_call",
        "shell_call", "apply_patch_call",
    }
)  # fmt: skip
TOOL_SEARCH = frozenset({"tool_search_call", "tool_search_output"})

log = logging.getLogger(__name__)


def now_text() -> str:
    """As SQLite's CURRENT_TIMESTAMP writes it (UTC, to the second)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())


def message_type(item: Any) -> str:
    if isinstance(item, dict):
        if item.get("role") in ("user", "assistant"):
            return str(item["role"])
        if item.get("type"):
            return str(item["type"])
    return "other"


def tool_name(item: Any) -> str | None:
    if not isinstance(item, dict):
        return None
    kind = item.get("type")
    if kind in ("mcp_call", "mcp_approval_request") and "server_label" in item:
        label, name = item.get("server_label"), item.get("name")
        if name and label:
            return f"{label}.{name}"
        return str(label) if label else (str(name) if name else None)
    if kind in TOOL_SEARCH:
        return "tool_search"
    if kind in NAMED_BY_TYPE:
        return str(kind)
    if "name" in item and item["name"] is not None:
        name = str(item["name"])
        namespace = None if item.get("namespace") is None else str(item["namespace"])
        if is_reserved_synthetic_tool_namespace(name, namespace):
            return name
        return tool_qualified_name(name, namespace) or name
    return None


def is_user_message(item: Any) -> bool:
    return isinstance(item, dict) and item.get("role") == "user"


def content_preview(content: Any, max_length: int | None = None) -> str:
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    if max_length is not None and len(text) > max_length:
        return text[:max_length] + "..."
    return text


def generation_of(value: dict[str, Any] | None) -> int:
    return int(value["generation"]) if value else 0


def cleared_since(generation: int, captured: BranchState) -> bool:
    """Whether the session was cleared since a call captured its branch state (one
    captured before the instance first read the generation: not since)."""
    return captured[1] is not None and generation != captured[1]


class AdvancedSessionCore:
    def __init__(
        self,
        *,
        session_id: str,
        socket_path: str | None = None,
        create_tables: bool = False,
        logger: logging.Logger | None = None,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        prefix: str = "agents-advanced/",
        timeout: float | None = 60.0,
        client: AsyncClient | None = None,
        owner: str | None = None,
        lease_ttl_s: float = LEASE_TTL_S,
    ) -> None:
        """client, owner: as SessionStoreSession takes them."""
        self.session_id = session_id
        self.session_settings: SessionSettings | None = settings_of(session_settings)
        self.socket_path = socket_of(socket_path, client)
        self._logger = logger if logger is not None else log
        self._root = f"{prefix}{key_part(session_id)}/"
        self._generation_key = self._root + "g"
        self.owner = owner_of(owner, lease_ttl_s)
        self.owner_key = self._root + "o"  # the session's owner document (ownership.py)
        self.effects_prefix = self._root + "f/"  # its tool effects (sessionstore.effects)
        # (current branch, clear generation); the generation is the session's as this
        # instance first reads it (None until then), as the SDK's reads it when it opens
        self._branch_state: BranchState = (MAIN, None)
        self._clients = ClientPerLoop(self.socket_path, timeout, client)
        self.timeout = self._clients.timeout
        self._ordered: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}
        # what this instance's last add wrote: the next add from the same branch state
        # sends its txn at once, under those requirements, and reads only when they fail
        self._last_add: tuple[BranchState, str, dict[str, Any] | None, Any] | None = None

    def _txn(self, ops: list[dict[str, Any]], require: list[dict[str, Any]]) -> Plan[None]:
        """A write to the session, under the owner's lease when it has an owner."""
        yield from fenced_txn(self.owner, self.owner_key, ops, require)

    def effects(self) -> AsyncLedger:
        """The session's tool-effect ledger (sessionstore.effects): its records are writes
        to the session, under its owner, and clear_session removes them."""
        runner = plans.Runner(self.socket_path, self.timeout, async_clients=self._clients)
        return AsyncLedger.of_adapter(Scope(self.effects_prefix, self._txn), runner)

    async def take_over(self) -> None:
        """This session object's owner takes the session, at the next epoch: its previous
        owner's next write is refused with StaleOwner (owner= needed)."""
        await plans.arun(self._clients.current(), take_over(self.owner, self.owner_key))

    @property
    def _current_branch_id(self) -> str:
        return self._branch_state[0]

    @property
    def _generation(self) -> int | None:
        return self._branch_state[1]

    # -- keys ------------------------------------------------------------------------

    def _items_prefix(self, branch: str) -> str:
        return f"{self._root}m/{key_part(branch)}/"

    def _head_key(self, branch: str) -> str:
        return f"{self._root}h/{key_part(branch)}"

    def _reserved_key(self, branch: str) -> str:
        return f"{self._root}r/{key_part(branch)}"

    def _usage_prefix(self, branch: str | None) -> str:
        return f"{self._root}u/" + ("" if branch is None else f"{key_part(branch)}/")

    def _usage_key(self, branch: str, turn: int) -> str:
        return f"{self._usage_prefix(branch)}{turn:010d}"

    # -- plumbing ----------------------------------------------------------------------

    def _client(self) -> AsyncClient:
        return self._clients.current()

    async def _run(self, plan: Plan[Any]) -> Any:
        return await plans.arun(self._client(), plan)

    def _lock(self) -> asyncio.Lock:
        """Orders this instance's changes and usage captures in call order."""
        loop = asyncio.get_running_loop()
        lock = self._ordered.get(loop)
        if lock is None:
            lock = self._ordered[loop] = asyncio.Lock()
        return lock

    async def close(self) -> None:
        await self._clients.aclose()

    def _resolved(self, generation_doc: dict[str, Any] | None, captured: BranchState) -> str:
        """The branch a call captured at its start, unless the session was cleared since:
        then this instance is back on main, as the SDK's is."""
        generation = generation_of(generation_doc)
        if self._branch_state[1] is None:  # this instance's first read: where it starts
            self._branch_state = (self._branch_state[0], generation)
        elif generation != self._branch_state[1]:
            self._branch_state = (MAIN, generation)
        return self._branch_state[0] if cleared_since(generation, captured) else captured[0]

    def _branch_now(
        self, captured: BranchState
    ) -> Plan[tuple[dict[str, Any] | None, str, dict[str, Any] | None]]:
        """The clear generation, the branch a call works on (the one it captured, or main
        after a clear), and that branch's head, in one round trip."""
        generation, *heads = yield [
            r.checkpoint_get(KIND, self._generation_key),
            r.checkpoint_get(KIND, self._head_key(captured[0])),
            r.checkpoint_get(KIND, self._head_key(MAIN)),
        ]
        branch = self._resolved(generation, captured)
        return generation, branch, heads[0] if branch == captured[0] else heads[1]

    def _read_branch(self, generation_doc: dict[str, Any] | None, branch_id: str | None) -> str:
        if branch_id is not None:
            return branch_id
        return self._resolved(generation_doc, self._branch_state)

    def _entries(self, branch: str) -> Plan[Items]:
        return (yield from every_item(self._items_prefix(branch)))

    def _branch_entries(self, branch_id: str | None) -> Plan[list[dict[str, Any]]]:
        (generation,) = yield [r.checkpoint_get(KIND, self._generation_key)]
        branch = self._read_branch(generation, branch_id)
        return [entry["value"] for entry in (yield from self._entries(branch))]

    # -- usage plans --------------------------------------------------------------------------

    def _store_usage(self, usage: Any, captured: BranchState) -> Plan[None]:
        (generation,) = yield [r.checkpoint_get(KIND, self._generation_key)]
        self._resolved(generation, captured)
        if cleared_since(generation_of(generation), captured):
            return  # the turn the call meant is gone
        branch = captured[0]
        (head,) = yield [r.checkpoint_get(KIND, self._head_key(branch))]
        if head is None or not head["turn"]:
            return
        turn = head["turn"]
        anchor = yield from self._turn_anchor(branch, turn)
        if anchor is None:
            return
        value = {
            "requests": usage.requests or 0,
            "input_tokens": usage.input_tokens or 0,
            "output_tokens": usage.output_tokens or 0,
            "total_tokens": usage.total_tokens or 0,
            "input_tokens_details": usage_details(getattr(usage, "input_tokens_details", None)),
            "output_tokens_details": usage_details(getattr(usage, "output_tokens_details", None)),
        }
        try:  # only while the turn's first item is there: a popped turn records nothing
            first = {"kind": KIND, "key": anchor["key"], "digest": anchor["digest"]}
            yield from self._txn([put_op(self._usage_key(branch, turn), value)], [first])
        except Conflict:
            return

    def _turn_anchor(self, branch: str, turn: int) -> Plan[dict[str, Any] | None]:
        """The first item of the branch's turn (newest first until the turn begins)."""
        before: str | None = None
        first = None
        while True:
            (page,) = yield [
                r.checkpoint_scan(
                    KIND, self._items_prefix(branch), before=before, limit=SCAN_PAGE, reverse=True
                )
            ]
            for entry in page["items"]:
                if entry["value"]["turn"] < turn:
                    return first
                if entry["value"]["turn"] == turn:
                    first = entry
            before = page["next"]
            if before is None:
                return first

    def _turn_usage(
        self, turn: int | None, branch_id: str | None
    ) -> Plan[list[dict[str, Any]] | dict[str, Any]]:
        (generation,) = yield [r.checkpoint_get(KIND, self._generation_key)]
        branch = self._read_branch(generation, branch_id)
        if turn is not None:
            (value,) = yield [r.checkpoint_get(KIND, self._usage_key(branch, turn))]
            return dict(value) if value else {}
        rows = yield from every_item(self._usage_prefix(branch))
        return [
            {"user_turn_number": int(row["key"].rsplit("/", 1)[1]), **row["value"]} for row in rows
        ]


def first_free_name(base: str, taken: set[str]) -> str:
    """The SDK's generated id: base, else base_2, base_3, ... the first not taken."""
    if base not in taken:
        return base
    suffix = 2
    while f"{base}_{suffix}" in taken:
        suffix += 1
    return f"{base}_{suffix}"


def user_entries(entries: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in entries if e["type"] == "user" and isinstance(e["item"], dict)]


def turn_summary(entry: dict[str, Any], preview_length: int | None) -> dict[str, Any]:
    content = entry["item"].get("content", "")
    return {
        "turn": entry["bturn"],
        "content": content_preview(content, preview_length),
        "full_content": content,
        "timestamp": entry["at"],
        "can_branch": True,
    }


def usage_details(details: Any) -> dict[str, Any] | None:
    if not details:
        return None
    try:
        return dict(details.__dict__)
    except (TypeError, AttributeError):
        return None


def tool_usage(entries: list[dict[str, Any]]) -> list[tuple[str, int, int]]:
    """(tool, uses, turn) per tool and turn, by turn: the calls, and the tool searches
    whose output came without a call in the same turn."""
    counted: dict[tuple[Any, int], int] = {}
    searched = {(e["turn"], e["tool"]) for e in entries if e["type"] == "tool_search_call"}
    for entry in entries:
        kind, name = entry["type"], entry["tool"]
        if kind in TOOL_CALL_TYPES:
            if name is None and kind in ("shell_call", "apply_patch_call"):
                name = kind
        elif not (kind == "tool_search_output" and (entry["turn"], name) not in searched):
            continue
        counted[(name, entry["turn"])] = counted.get((name, entry["turn"]), 0) + 1
    ordered = sorted(counted.items(), key=lambda c: (c[0][1], c[0][0] is not None, c[0][0] or ""))
    return [(name, uses, turn) for (name, turn), uses in ordered]
