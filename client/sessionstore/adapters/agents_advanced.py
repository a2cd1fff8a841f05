# The Agents SDK's AdvancedSQLiteSession on sessionstore: conversation
# branches, turn queries and usage per turn, with the SDK's method names,
# signatures and answers (`AdvancedSessionStoreSession`).
#
# Every document is `kv`, under P = PREFIX + the session id + "/":
#   P m/BRANCH/SEQ   one item of a branch, in order: {item, type, turn, bturn,
#                    tool, at}, appended (the daemon picks SEQ: commit order);
#                    a branch made from another copies its items under the
#                    same SEQs, so later appends still sort after them
#   P h/BRANCH       the branch's head: {turn, bturn, count, users, created,
#                    made_ms}; it exists while the branch holds an item
#   P r/BRANCH       a branch id once used: never given out again
#   P u/BRANCH/TURN  a turn's usage (TURN as 10 digits)
#   P g              {generation}: how many times the session was cleared
# BRANCH is key_part(branch id). Each change is one txn that requires the
# head (and the generation) to be as it was read, so two processes adding to
# one branch take turns (the loser reads again and retries), a branch is made
# whole or not at all, and two processes branching at once each get a branch of
# their own: the second finds the id reserved and takes the next suffix. An
# instance's current branch is its own, as the SDK's is; when another instance
# clears the session, the next call moves it back to "main".
#
# Where it differs from the SDK's: a branch holds copies of the items it
# was made from (the SDK shares rows), so a branch made from a turn copies at
# most TXN_OPS - 3 items; a clear removes at most 100,000 items of all branches
# in one txn (the daemon's limit for a range delete), and refuses more; and
# there are no SQL tables to create or own (create_tables is accepted, and
# changes nothing).
from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import cbor2
from agents import _debug
from agents._tool_identity import is_reserved_synthetic_tool_namespace, tool_qualified_name
from agents.memory.session_settings import (
    SessionSettings,
    resolve_session_limit,
)

from .. import requests as r
from ..asyncio_client import AsyncClient, ClientPerLoop
from ..errors import Conflict
from . import plans
from .agents import settings_of
from .keyparts import key_part
from .lifetime import Items, digest_of, every_item
from .plans import (
    KIND,
    SCAN_PAGE,
    TXN_OPS,
    Plan,
    delete_op,
    delete_prefix_op,
    put_op,
    socket_of,
)

if TYPE_CHECKING:
    from agents.items import TResponseInputItem
    from agents.result import RunResult

MAIN = "main"
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


def _now_text() -> str:
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


def _is_user(item: Any) -> bool:
    return isinstance(item, dict) and item.get("role") == "user"


def content_preview(content: Any, max_length: int | None = None) -> str:
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    if max_length is not None and len(text) > max_length:
        return text[:max_length] + "..."
    return text


def _require(key: str, value: dict[str, Any] | None) -> dict[str, Any]:
    """The requirement that the document at key is as read: this value, or absent."""
    if value is None:
        return {"kind": KIND, "key": key, "exists": False}
    return {"kind": KIND, "key": key, "digest": digest_of(value)}


def _generation(value: dict[str, Any] | None) -> int:
    return int(value["generation"]) if value else 0


class AdvancedSessionStoreSession:
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
    ) -> None:
        """client: as SessionStoreSession takes it."""
        self.session_id = session_id
        self.session_settings: SessionSettings | None = settings_of(session_settings)
        self.socket_path = socket_of(socket_path, client)
        self._logger = logger if logger is not None else log
        self._root = f"{prefix}{key_part(session_id)}/"
        self._generation_key = self._root + "g"
        self._branch_state: tuple[str, int] = (MAIN, 0)  # (current branch, generation)
        self._clients = ClientPerLoop(self.socket_path, timeout, client)
        self.timeout = self._clients.timeout
        self._ordered: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}
        # what this instance's last add wrote: the next add from the same branch state
        # sends its txn at once, under those requirements, and reads only when they fail
        self._last_add: tuple[tuple[str, int], str, dict[str, Any] | None, Any] | None = None

    @property
    def _current_branch_id(self) -> str:
        return self._branch_state[0]

    @property
    def _generation(self) -> int:
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

    def _resolved(self, generation_doc: dict[str, Any] | None, captured: tuple[str, int]) -> str:
        """The branch a call captured at its start, unless the session was cleared since:
        then this instance is back on main, as the SDK's is."""
        generation = _generation(generation_doc)
        if generation != self._branch_state[1]:
            self._branch_state = (MAIN, generation)
        return self._branch_state[0] if generation != captured[1] else captured[0]

    def _branch_now(
        self, captured: tuple[str, int]
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

    # -- the Session protocol ------------------------------------------------------------

    async def get_items(
        self, limit: int | None = None, branch_id: str | None = None
    ) -> list[TResponseInputItem]:
        wanted = resolve_session_limit(limit, self.session_settings)
        return await self._run(self._get_items(wanted, branch_id))  # type: ignore[no-any-return]

    def _get_items(self, wanted: int | None, branch_id: str | None) -> Plan[list[Any]]:
        (generation,) = yield [r.checkpoint_get(KIND, self._generation_key)]
        prefix = self._items_prefix(self._read_branch(generation, branch_id))
        if wanted is not None and wanted == 0:
            return []
        if wanted is None or wanted < 0:
            return [entry["value"]["item"] for entry in (yield from every_item(prefix))]
        found: Items = []
        before: str | None = None
        while len(found) < wanted:
            scan = r.checkpoint_scan(
                KIND, prefix, before=before, limit=min(SCAN_PAGE, wanted - len(found)), reverse=True
            )
            (page,) = yield [scan]
            found += page["items"]
            before = page["next"]
            if before is None:
                break
        return [entry["value"]["item"] for entry in reversed(found)]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        if not items:
            return
        try:  # every item before any txn goes, so that a bad one stores nothing
            cbor2.dumps(items)
        except (cbor2.CBOREncodeError, TypeError, ValueError) as error:
            raise TypeError(f"an item cannot be stored: {error}") from error
        captured = self._branch_state  # at the call, as the SDK's: a switch after it waits
        async with self._lock():
            for start in range(0, len(items), PER_ADD_TXN):
                await self._run(self._add(items[start : start + PER_ADD_TXN], captured))

    def _add(self, items: list[Any], captured: tuple[str, int]) -> Plan[None]:
        while True:
            known = self._last_add
            if known is not None and known[0] == captured:  # this instance's own last add
                _, branch, generation, head = known
            else:
                generation, branch, head = yield from self._branch_now(captured)
            state = dict(head or {"turn": 0, "bturn": 0, "count": 0, "users": 0})
            if head is None:
                state.update(created=_now_text(), made_ms=time.time_ns() // 1_000_000)
            at, ops = _now_text(), []
            for item in items:
                if _is_user(item):
                    state["turn"] += 1
                    state["bturn"] += 1
                    state["users"] += 1
                value = {
                    "item": item,
                    "type": message_type(item),
                    "turn": state["turn"],
                    "bturn": state["bturn"],
                    "tool": tool_name(item),
                    "at": at,
                }
                ops.append({"op": "append", "kind": KIND, "prefix": self._items_prefix(branch),
                            "value": value})  # fmt: skip
            state["count"] += len(items)
            ops.append(put_op(self._head_key(branch), state))
            require = [
                _require(self._generation_key, generation),
                _require(self._head_key(branch), head),
            ]
            self._last_add = None
            try:
                yield [r.txn(ops, require)]
            except Conflict:
                continue  # another writer moved the branch: read it again
            self._last_add = (captured, branch, generation, state)
            return

    async def pop_item(self) -> TResponseInputItem | None:
        captured = self._branch_state
        async with self._lock():
            return await self._run(self._pop(captured))  # type: ignore[no-any-return]

    def _pop(self, captured: tuple[str, int]) -> Plan[Any]:
        self._last_add = None
        while True:
            (generation,) = yield [r.checkpoint_get(KIND, self._generation_key)]
            branch = self._resolved(generation, captured)
            head, page = yield [
                r.checkpoint_get(KIND, self._head_key(branch)),
                r.checkpoint_scan(KIND, self._items_prefix(branch), limit=2, reverse=True),
            ]
            if head is None or not page["items"]:
                return None
            newest, *rest = page["items"]
            popped = newest["value"]
            after = rest[0]["value"] if rest else None
            ops = [delete_op(newest["key"])]
            if after is None:  # the branch is empty: it no longer exists, its id stays used
                ops += [delete_op(self._head_key(branch)),
                        put_op(self._reserved_key(branch), {}, if_absent=True)]  # fmt: skip
            else:
                users = head["users"] - (popped["type"] == "user")
                state = {**head, "turn": after["turn"], "bturn": after["bturn"]}
                state.update(count=head["count"] - 1, users=users)
                ops.append(put_op(self._head_key(branch), state))
            if after is None or after["turn"] != popped["turn"]:  # its turn is gone too
                ops.append(delete_op(self._usage_key(branch, popped["turn"])))
            require = [
                _require(self._generation_key, generation),
                _require(self._head_key(branch), head),
                {"kind": KIND, "key": newest["key"], "digest": newest["digest"]},
            ]
            try:
                yield [r.txn(ops, require)]
            except Conflict:
                continue
            return popped["item"]

    async def clear_session(self) -> None:
        async with self._lock():
            await self._run(self._clear())

    def _clear(self) -> Plan[None]:
        self._last_add = None
        while True:
            (generation,) = yield [r.checkpoint_get(KIND, self._generation_key)]
            heads = yield from every_item(f"{self._root}h/", values=False)
            used = [head["key"].replace("/h/", "/r/", 1) for head in heads]
            ops = [put_op(key, {}, if_absent=True) for key in used]
            ops += [delete_prefix_op(f"{self._root}{part}/") for part in ("m", "h", "u")]
            cleared = _generation(generation) + 1
            ops.append(put_op(self._generation_key, {"generation": cleared}))
            require = [_require(self._generation_key, generation)]
            try:
                yield [r.txn(ops, require)]
            except Conflict:
                continue
            self._branch_state = (MAIN, cleared)
            return

    # -- branches --------------------------------------------------------------------------

    async def create_branch_from_turn(
        self, turn_number: int, branch_name: str | None = None
    ) -> str:
        if branch_name is not None and not branch_name.strip():
            raise ValueError("Branch name cannot be empty")
        async with self._lock():
            made, source, preview = await self._run(
                self._branch_from(turn_number, branch_name, self._branch_state)
            )
        if _debug.DONT_LOG_MODEL_DATA:
            self._logger.debug(
                "Created branch '%s' from turn %s in '%s'", made, turn_number, source
            )
        else:
            self._logger.debug(
                "Created branch '%s' from turn %s ('%s') in '%s'",
                made,
                turn_number,
                preview,
                source,
            )
        return made  # type: ignore[no-any-return]

    def _branch_from(
        self, turn: int, name: str | None, captured: tuple[str, int]
    ) -> Plan[tuple[str, str, str]]:
        self._last_add = None
        base = f"branch_from_turn_{turn}_{int(time.time())}"
        while True:
            generation, source, head = yield from self._branch_now(captured)
            entries = yield from self._entries(source)
            taken: set[str] = set()
            if name is None:  # the ids of this second already used: the next suffix is free
                used = yield from every_item(self._reserved_key(base), values=False)
                taken = {unquote(item["key"].rsplit("/", 1)[1]) for item in used}
            user = next(
                (e["value"] for e in entries
                 if e["value"]["bturn"] == turn and e["value"]["type"] == "user"),
                None,
            )  # fmt: skip
            if user is None:
                raise ValueError(
                    f"Turn {turn} does not contain a user message in branch '{source}'"
                )
            content = user["item"].get("content", "") if isinstance(user["item"], dict) else ""
            preview = (
                content[:50] + "..."
                if isinstance(content, str) and len(content) > 50
                else (content if isinstance(content, str) else "Unable to parse content")
            )
            branch = name if name is not None else _free(base, taken)
            copies = [e for e in entries if e["value"]["bturn"] < turn]
            if len(copies) > TXN_OPS - 3:
                raise ValueError(
                    f"turn {turn} has {len(copies)} items before it: a branch copies at most "
                    f"{TXN_OPS - 3} in one txn"
                )
            at = _now_text()
            prefix = self._items_prefix(branch)
            ops = [put_op(self._reserved_key(branch), {})]
            ops += [put_op(prefix + e["key"].rsplit("/", 1)[1], {**e["value"], "at": at})
                    for e in copies]  # fmt: skip
            if copies:
                values = [e["value"] for e in copies]
                state = {
                    "turn": max(v["turn"] for v in values),
                    "bturn": max(v["bturn"] for v in values),
                    "count": len(values),
                    "users": sum(v["type"] == "user" for v in values),
                    "created": at,
                    "made_ms": time.time_ns() // 1_000_000,
                }
                ops.append(put_op(self._head_key(branch), state))
            require = [
                _require(self._generation_key, generation),
                _require(self._head_key(source), head),
                _require(self._reserved_key(branch), None),
                _require(self._head_key(branch), None),
            ]
            try:
                yield [r.txn(ops, require)]
            except Conflict as conflict:
                if conflict.details.get("failed", 0) >= 2 and name is not None:
                    raise ValueError(
                        f"Branch ID '{name}' has already been used. Choose a new branch ID."
                    ) from None
                continue  # the source moved, the session was cleared, or the id was taken
            self._branch_state = (branch, _generation(generation))
            return branch, source, preview

    async def create_branch_from_content(
        self, search_term: str, branch_name: str | None = None
    ) -> str:
        matching = await self.find_turns_by_content(search_term)
        if not matching:
            raise ValueError(f"No user turns found containing '{search_term}'")
        return await self.create_branch_from_turn(matching[0]["turn"], branch_name)

    async def switch_to_branch(self, branch_id: str) -> None:
        async with self._lock():
            generation, head = await self._run(self._branch_head(branch_id))
            if head is None:
                raise ValueError(f"Branch '{branch_id}' does not exist")
            old = self._branch_state[0]
            self._branch_state = (branch_id, _generation(generation))
        self._logger.info("Switched from branch '%s' to '%s'", old, branch_id)

    def _branch_head(self, branch: str) -> Plan[list[Any]]:
        return (
            yield [
                r.checkpoint_get(KIND, self._generation_key),
                r.checkpoint_get(KIND, self._head_key(branch)),
            ]
        )

    async def delete_branch(self, branch_id: str, force: bool = False) -> None:
        if not branch_id or not branch_id.strip():
            raise ValueError("Branch ID cannot be empty")
        if branch_id == MAIN:
            raise ValueError("Cannot delete the 'main' branch")
        if branch_id == self._branch_state[0]:
            if not force:
                raise ValueError(
                    f"Cannot delete current branch '{branch_id}'. Use force=True or switch "
                    "branches first"
                )
            if not any(b["branch_id"] == branch_id for b in await self.list_branches()):
                raise ValueError(f"Branch '{branch_id}' does not exist")
            await self.switch_to_branch(MAIN)
        async with self._lock():
            deleted = await self._run(self._delete_branch(branch_id))
        self._logger.info("Deleted branch '%s': %s message entries", branch_id, deleted)

    def _delete_branch(self, branch: str) -> Plan[int]:
        self._last_add = None
        while True:
            _, head = yield from self._branch_head(branch)
            if head is None:
                raise ValueError(f"Branch '{branch}' does not exist")
            ops = [
                delete_prefix_op(self._items_prefix(branch)),
                delete_prefix_op(self._usage_prefix(branch)),
                delete_op(self._head_key(branch)),
                put_op(self._reserved_key(branch), {}, if_absent=True),
            ]
            try:
                yield [r.txn(ops, [_require(self._head_key(branch), head)])]
            except Conflict:
                continue
            return int(head["count"])

    async def list_branches(self) -> list[dict[str, Any]]:
        return await self._run(self._list_branches())  # type: ignore[no-any-return]

    def _list_branches(self) -> Plan[list[dict[str, Any]]]:
        (generation,) = yield [r.checkpoint_get(KIND, self._generation_key)]
        current = self._read_branch(generation, None)
        heads = yield from every_item(f"{self._root}h/")
        branches = []
        for head in sorted(heads, key=lambda h: (h["value"]["made_ms"], h["key"])):
            branch = unquote(head["key"].rsplit("/", 1)[1])
            value = head["value"]
            branches.append(
                {
                    "branch_id": branch,
                    "message_count": value["count"],
                    "user_turns": value["users"],
                    "is_current": branch == current,
                    "created_at": value["created"],
                }
            )
        return branches

    # -- turns -------------------------------------------------------------------------------

    async def get_conversation_turns(self, branch_id: str | None = None) -> list[dict[str, Any]]:
        entries = await self._run(self._branch_entries(branch_id))
        return [_turn(e, 100) for e in sorted(_users(entries), key=lambda e: e["bturn"])]

    async def find_turns_by_content(
        self, search_term: str, branch_id: str | None = None
    ) -> list[dict[str, Any]]:
        pattern = re.compile(re.escape(search_term), re.IGNORECASE | re.ASCII)
        entries = await self._run(self._branch_entries(branch_id))
        found = []
        for entry in sorted(_users(entries), key=lambda e: e["bturn"]):
            content = entry["item"].get("content", "")
            texts = [content] if isinstance(content, str) else [
                part.get("text", "") for part in content if isinstance(part, dict)
            ]  # fmt: skip
            if any(isinstance(t, str) and pattern.search(t) for t in texts):
                found.append(_turn(entry, None))
        return found

    async def get_conversation_by_turns(
        self, branch_id: str | None = None
    ) -> dict[int, list[dict[str, str | None]]]:
        entries = await self._run(self._branch_entries(branch_id))
        turns: dict[int, list[dict[str, str | None]]] = {}
        for entry in entries:
            turns.setdefault(entry["turn"], []).append(
                {"type": entry["type"], "tool_name": entry["tool"]}
            )
        return turns

    async def get_tool_usage(self, branch_id: str | None = None) -> list[tuple[str, int, int]]:
        entries = await self._run(self._branch_entries(branch_id))
        return tool_usage(entries)

    # -- usage -------------------------------------------------------------------------------

    async def store_run_usage(self, result: RunResult) -> None:
        try:
            usage = result.context_wrapper.usage
            if usage is None:
                return
            captured = self._branch_state
            async with self._lock():
                await self._run(self._store_usage(usage, captured))
        except Exception as error:  # as the SDK's: usage is never worth a failed run
            self._logger.error("Failed to store session usage: %s", error)

    def _store_usage(self, usage: Any, captured: tuple[str, int]) -> Plan[None]:
        (generation,) = yield [r.checkpoint_get(KIND, self._generation_key)]
        if _generation(generation) != captured[1]:
            self._resolved(generation, captured)
            return  # cleared since the call: the turn it meant is gone
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
            "input_tokens_details": _details(getattr(usage, "input_tokens_details", None)),
            "output_tokens_details": _details(getattr(usage, "output_tokens_details", None)),
        }
        try:  # only while the turn's first item is there: a popped turn records nothing
            first = {"kind": KIND, "key": anchor["key"], "digest": anchor["digest"]}
            yield [r.txn([put_op(self._usage_key(branch, turn), value)], [first])]
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

    async def get_session_usage(self, branch_id: str | None = None) -> dict[str, int] | None:
        rows = await self._run(every_item(self._usage_prefix(branch_id or None)))
        if not rows:
            return None
        fields = ("requests", "input_tokens", "output_tokens", "total_tokens")
        totals = {field: sum(row["value"][field] for row in rows) for field in fields}
        return {**totals, "total_turns": len(rows)}

    async def get_turn_usage(
        self, user_turn_number: int | None = None, branch_id: str | None = None
    ) -> list[dict[str, Any]] | dict[str, Any]:
        return await self._run(  # type: ignore[no-any-return]
            self._turn_usage(user_turn_number, branch_id)
        )

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


def _free(base: str, taken: set[str]) -> str:
    """The SDK's generated id: base, else base_2, base_3, ... the first not taken."""
    if base not in taken:
        return base
    suffix = 2
    while f"{base}_{suffix}" in taken:
        suffix += 1
    return f"{base}_{suffix}"


def _users(entries: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in entries if e["type"] == "user" and isinstance(e["item"], dict)]


def _turn(entry: dict[str, Any], preview_length: int | None) -> dict[str, Any]:
    content = entry["item"].get("content", "")
    return {
        "turn": entry["bturn"],
        "content": content_preview(content, preview_length),
        "full_content": content,
        "timestamp": entry["at"],
        "can_branch": True,
    }


def _details(details: Any) -> dict[str, Any] | None:
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
