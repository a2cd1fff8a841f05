# Every exception the storage engine raises, in one place.
from __future__ import annotations

import errno


class FatalStorageError(Exception):
    """The store can no longer promise durability: stop, and let recovery run at the next start."""


class StoreLocked(Exception):
    """Another daemon holds the state directory's lock."""


class StoreFormatError(Exception):
    """The state directory cannot be opened as it is; the message is one line naming why."""


class InjectedFault(OSError):
    def __init__(self, point: str) -> None:
        super().__init__(errno.EIO, f"injected fault at failpoint {point}")
        self.point = point


class DiskFull(OSError):
    """The disk is full: this operation is refused, the store goes on serving."""


class CorruptRecord(Exception):
    """Damaged bytes on disk, named by file and offset."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"{path}: offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


class RestoreRefused(Exception):
    """A restore's target is not an empty store, or what it built does not check."""


# -- the log engine ----------------------------------------------------------------


class FileTooLarge(OSError):
    """A file the log reads whole (metadata, an index checkpoint) is over its limit."""


class IndexCheckpointError(Exception):
    """An index checkpoint that cannot be used; recovery replays the log instead."""


# -- PostgreSQL --------------------------------------------------------------------


class KeyingRefused(Exception):
    """This daemon does not hold the keys the database needs; the message says which."""


class RekeyRefused(Exception):
    """The rotation cannot start or go on; one line says why."""


class OlderDaemonsConnected(Exception):
    """Daemons of an earlier schema version still use the database: the message says so."""


class DatabaseUnreachable(Exception):
    """PostgreSQL does not answer (yet): the daemon waits and retries."""

    def __init__(self, message: str, *, unresolved: bool = False) -> None:
        super().__init__(message)
        self.unresolved = unresolved  # the host name does not resolve (not a DNS outage)


class DatabaseUnavailable(OSError):
    """A read that the database failed or did not answer in time (io_error)."""


class DatabaseRefused(Exception):
    """A bad URL, bad credentials, a missing database, a key mismatch: exit with this."""


# -- sealing (encryption at rest) --------------------------------------------------


class KeyFileError(Exception):
    """A key file that cannot be used; the message is one line naming the file."""


class SealError(Exception):
    """A sealed record that does not open under the key (or is damaged): at offset."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(reason)
        self.offset = offset
        self.reason = reason
