# The wire contract's error codes, one vocabulary for the protocol, the daemon's
# ops and storage, and the clients' exceptions (errors.py has one class per code).
# The daemon gives each as a Refusal (shared.py); the catalogue below says when.
# Details are the error map's other fields.
from __future__ import annotations

import enum


class ErrorCode(enum.StrEnum):
    # The item is not a request: not CBOR or JSON, not a map, no `op`, a frame the
    # walker refuses (nesting, a lone surrogate); or an argument is missing or of the
    # wrong type. A framing error closes the connection after its reply.
    BAD_REQUEST = "bad_request"
    # `op` names no op of this daemon. The connection goes on.
    UNKNOWN_OP = "unknown_op"
    # `update` of a component other than `session`, or `fork`, names a session that
    # does not exist.
    NOT_FOUND = "not_found"
    # `expect` does not match the current digest (details: `current`, the digest or
    # null); a txn's requirement is not met (details: `failed`, its index, and
    # `current`). Nothing is written.
    CONFLICT = "conflict"
    # A lease is held and the write named none, or named one that is not current
    # (details: `epoch`, `holder`). Nothing is written.
    FENCED = "fenced"
    # A snapshot breaks the document rules (daemon: snapshot.py), or cannot be
    # encoded canonically.
    INVALID_SNAPSHOT = "invalid_snapshot"
    # An item over the request limit (the connection closes), a document over the
    # snapshot limit (also one that `update` or `fork` would make), or a request that
    # needs more memory to decode than a worker may use.
    TOO_LARGE = "too_large"
    # `watch` from a seq whose history is gone, or `load`, `fork` or `revert` at a
    # generation no longer kept (details: `oldest_seq`).
    COMPACTED = "compacted"
    # The disk is full: a new generation does not fit (removals still do), or
    # `compact` found nothing it could free.
    NO_SPACE = "no_space"
    # A stored generation cannot be read whole (damage, a record sealed under
    # another key, a plaintext one in a sealed store: the message names the file and
    # offset), an injected fault, or the database failed the batch. A failed fsync
    # is this too, for every pending request, and then the daemon exits.
    IO_ERROR = "io_error"
    # Reserved by the contract; this daemon never gives it (a read-only peer's write
    # is `unauthorized`).
    READ_ONLY = "read_only"
    # The peer's uid may not use this op (SO_PEERCRED): a read-only peer's write, or
    # any request of a peer with no access (one reply, then the connection closes).
    UNAUTHORIZED = "unauthorized"
    # More connections than the daemon takes: the reply, then the connection closes.
    OVERLOADED = "overloaded"
    # The daemon is stopping: requests it will not run get this.
    SHUTTING_DOWN = "shutting_down"
    # Our bug, never the client's: logged, counted in `stats.internal_errors`, and
    # the connection goes on.
    INTERNAL = "internal"
