# The Agents SDK's AdvancedSQLiteSession on sessionstore: conversation
# branches, turn queries and usage per turn, with the SDK's method names,
# signatures and answers (`AdvancedSessionStoreSession`).
#
# Every document is `kv`, under P = PREFIX + the session id + "/":
#   P m/BRANCH/SEQ   one item of a branch, in order: {item, type, turn, bturn,
#                    tool, at}, appended (the daemon picks SEQ: commit order);
#                    a branch made from another copies its items under the
#                    same SEQs, so later appends still sort after them
#   P h/BRANCH       the branch's head: {branch (its id), turn, bturn, count,
#                    users, created, made_ms}; it exists while the branch holds
#                    an item
#   P r/BRANCH       a branch id once used: never given out again
#   P u/BRANCH/TURN  a turn's usage (TURN as 10 digits)
#   P g              {generation}: how many times the session was cleared
# BRANCH is key_part(branch id), a hash for a long one: list_branches gives the
# id its head keeps. Each change is one txn that requires the
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

import re
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import cbor2
from agents import _debug
from agents.logger import log_model_action_error
from agents.memory.session_settings import (
    resolve_session_limit,
)

from .. import requests as r
from ..errors import Conflict
from .agents_advanced_core import (
    MAIN,
    PER_ADD_TXN,
    AdvancedSessionCore,
    BranchState,
    first_free_name,
    generation_of,
    is_user_message,
    message_type,
    now_text,
    tool_name,
    tool_usage,
    turn_summary,
    user_entries,
)
from .lifetime import Items, every_item, required
from .plans import (
    KIND,
    SCAN_PAGE,
    TXN_OPS,
    Plan,
    delete_op,
    delete_prefix_op,
    put_op,
)

if TYPE_CHECKING:
    from agents.items import TResponseInputItem
    from agents.result import RunResult


class AdvancedSessionStoreSession(AdvancedSessionCore):
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

    def _add(self, items: list[Any], captured: BranchState) -> Plan[None]:
        while True:
            known = self._last_add
            if known is not None and known[0] == captured:  # this instance's own last add
                _, branch, generation, head = known
            else:
                generation, branch, head = yield from self._branch_now(captured)
            state = dict(head or {"turn": 0, "bturn": 0, "count": 0, "users": 0})
            if head is None:
                state.update(created=now_text(), made_ms=time.time_ns() // 1_000_000)
            state["branch"] = branch
            at, ops = now_text(), []
            for item in items:
                if is_user_message(item):
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
                required(self._generation_key, generation),
                required(self._head_key(branch), head),
            ]
            self._last_add = None
            try:
                yield from self._txn(ops, require)
            except Conflict:
                continue  # another writer moved the branch: read it again
            self._last_add = (captured, branch, generation, state)
            return

    async def pop_item(self) -> TResponseInputItem | None:
        captured = self._branch_state
        async with self._lock():
            return await self._run(self._pop(captured))  # type: ignore[no-any-return]

    def _pop(self, captured: BranchState) -> Plan[Any]:
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
                required(self._generation_key, generation),
                required(self._head_key(branch), head),
                {"kind": KIND, "key": newest["key"], "digest": newest["digest"]},
            ]
            try:
                yield from self._txn(ops, require)
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
            ops.append(delete_prefix_op(self.effects_prefix))
            cleared = generation_of(generation) + 1
            ops.append(put_op(self._generation_key, {"generation": cleared}))
            require = [required(self._generation_key, generation)]
            try:
                yield from self._txn(ops, require)
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
        self, turn: int, name: str | None, captured: BranchState
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
            branch = name if name is not None else first_free_name(base, taken)
            copies = [e for e in entries if e["value"]["bturn"] < turn]
            if len(copies) > TXN_OPS - 3:
                raise ValueError(
                    f"turn {turn} has {len(copies)} items before it: a branch copies at most "
                    f"{TXN_OPS - 3} in one txn"
                )
            at = now_text()
            prefix = self._items_prefix(branch)
            ops = [put_op(self._reserved_key(branch), {})]
            ops += [put_op(prefix + e["key"].rsplit("/", 1)[1], {**e["value"], "at": at})
                    for e in copies]  # fmt: skip
            if copies:
                values = [e["value"] for e in copies]
                state = {
                    "branch": branch,
                    "turn": max(v["turn"] for v in values),
                    "bturn": max(v["bturn"] for v in values),
                    "count": len(values),
                    "users": sum(v["type"] == "user" for v in values),
                    "created": at,
                    "made_ms": time.time_ns() // 1_000_000,
                }
                ops.append(put_op(self._head_key(branch), state))
            require = [
                required(self._generation_key, generation),
                required(self._head_key(source), head),
                required(self._reserved_key(branch), None),
                required(self._head_key(branch), None),
            ]
            try:
                yield from self._txn(ops, require)
            except Conflict as conflict:
                if conflict.details.get("failed", 0) >= 2 and name is not None:
                    raise ValueError(
                        f"Branch ID '{name}' has already been used. Choose a new branch ID."
                    ) from None
                continue  # the source moved, the session was cleared, or the id was taken
            self._branch_state = (branch, generation_of(generation))
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
            self._branch_state = (branch_id, generation_of(generation))
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
                yield from self._txn(ops, [required(self._head_key(branch), head)])
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
            value = head["value"]
            # a head without its id: the id is its key's part (not a hashed one)
            branch = value.get("branch") or unquote(head["key"].rsplit("/", 1)[1])
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
        return [
            turn_summary(e, 100) for e in sorted(user_entries(entries), key=lambda e: e["bturn"])
        ]

    async def find_turns_by_content(
        self, search_term: str, branch_id: str | None = None
    ) -> list[dict[str, Any]]:
        pattern = re.compile(re.escape(search_term), re.IGNORECASE | re.ASCII)
        entries = await self._run(self._branch_entries(branch_id))
        found = []
        for entry in sorted(user_entries(entries), key=lambda e: e["bturn"]):
            content = entry["item"].get("content", "")
            texts = [content] if isinstance(content, str) else [
                part.get("text", "") for part in content if isinstance(part, dict)
            ]  # fmt: skip
            if any(isinstance(t, str) and pattern.search(t) for t in texts):
                found.append(turn_summary(entry, None))
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
            log_model_action_error(
                self._logger,
                "Failed to store session usage",
                error,
                diagnostic_extra=lambda: {"session_id": self.session_id},
            )

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
