# `sessionstored restore FILE --state-dir DIR` (or `--database URL`): a new store
# from a backup. Every byte of the file is checked first, and every document
# opened and checked against its digest, before anything is written; a damaged
# backup is refused naming the offset. The target must be empty. The store
# starts at the backup's seq, each document at its own. A sealed backup needs
# its key (--key-file); --new-key-file seals the new store with another key (a
# rekey on the way in, or sealing a plaintext backup's store).
from __future__ import annotations

import argparse
import os
from collections.abc import Iterator, Sequence

from sessionstore.backup_file import Backup, DamagedBackup, read_backup
from sessionstore.tools.helpformat import DefaultsShown, OneLineUsage

from ..exit_codes import ExitCode, refuse
from ..ops import backup_payload
from ..storage.documents import SESSION, Document
from ..storage.errors import KeyFileError, RestoreRefused, StoreFormatError, StoreLocked
from ..storage.sealing import Key, Sealer
from .keyfile import read_key_file

PROGRAM = "sessionstored restore"


def _parser() -> argparse.ArgumentParser:
    parser = OneLineUsage(
        prog="sessionstored restore",
        description="Build a new store from a backup (`sessionstore backup`), into an empty "
        "state directory or database only.",
        formatter_class=DefaultsShown,
    )
    parser.add_argument("file", help="the backup file")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--state-dir", help="the new embedded store's directory (absent or empty)")
    target.add_argument("--database", metavar="URL", help="an empty PostgreSQL database")
    parser.add_argument("--key-file", help="the key the backup is sealed with")
    parser.add_argument("--new-key-file", help="seal the new store with this key instead")
    return parser


def _documents(backup: Backup, sealer: Sealer) -> Iterator[Document]:
    """Each document, opened and checked; DamagedBackup names the payload's offset."""
    backup_id = backup.header["backup_id"]
    seen: set[tuple[str, str, int]] = set()  # a session's generations differ in seq
    for position, (offset, payload) in enumerate(backup.payloads()):
        try:
            doc = backup_payload.decode(sealer, backup_id, position, payload)
        except backup_payload.BadPayload as error:
            raise DamagedBackup(backup.path, offset, str(error)) from None
        named = (doc.kind, doc.id, doc.seq if doc.kind == SESSION else 0)
        if named in seen or doc.seq > backup.trailer.seq:
            reason = "a document twice, or after the backup's seq"
            raise DamagedBackup(backup.path, offset, reason)
        seen.add(named)
        yield doc


def _keys(args: argparse.Namespace, backup: Backup) -> tuple[Key | None, Key | None]:
    """(the key that opens the backup, the key the new store is sealed with)."""
    key = read_key_file(args.key_file) if args.key_file else None
    new = read_key_file(args.new_key_file) if args.new_key_file else None
    sealed_with = backup.header.get("sealed_with_key_id")
    if sealed_with is not None and (key is None or key.key_id_hex != sealed_with):
        given = f"key id {key.key_id_hex}" if key else "no key"
        raise KeyFileError(
            f"{backup.path}: sealed with key id {sealed_with} ({given} given): "
            "pass that key with --key-file"
        )
    if sealed_with is None and key is not None:
        raise KeyFileError(
            f"{backup.path}: not sealed; --new-key-file seals the restored store with a key"
        )
    return key, new if new is not None else key


def restore_main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    try:
        backup = read_backup(args.file)
        opener, sealing = _keys(args, backup)
        sealer = Sealer(opener)
        for _ in _documents(backup, sealer):  # every document checked before a byte is written
            pass
        seq = backup.trailer.seq
        if args.state_dir:
            from ..storage.log.fs import RealFileSystem
            from ..storage.log.restore import restore_log

            where = os.path.abspath(args.state_dir)
            os.makedirs(os.path.dirname(where), mode=0o700, exist_ok=True)
            count = restore_log(RealFileSystem(), where, sealing, _documents(backup, sealer), seq)
        else:
            where, count = _restore_database(args.database, sealing, backup, sealer)
    except KeyFileError as error:
        return refuse(PROGRAM, str(error), ExitCode.BAD_USAGE)
    except (DamagedBackup, RestoreRefused, StoreFormatError, StoreLocked) as error:
        return refuse(PROGRAM, str(error), ExitCode.FAILED)
    except OSError as error:
        return refuse(
            PROGRAM, f"{error.filename or args.file}: {error.strerror or error}", ExitCode.FAILED
        )
    sealed = f"sealed with key id {sealing.key_id_hex}" if sealing else "plaintext"
    print(
        f"sessionstored restore: {where}: {count} documents at seq {seq} ({sealed}) from "
        f"{args.file}"
    )
    return 0


def _restore_database(url: str, key: Key | None, backup: Backup, sealer: Sealer) -> tuple[str, int]:
    from ..storage.errors import DatabaseRefused, DatabaseUnreachable
    from ..storage.postgres.connection import redacted
    from ..storage.postgres.store import PgStore

    store = PgStore(url, key=key, password=os.environ.get("SESSIONSTORED_DATABASE_PASSWORD"))
    try:
        store.open()
        return redacted(url), store.restore(_documents(backup, sealer), backup.trailer.seq)
    except (DatabaseRefused, DatabaseUnreachable) as error:
        raise RestoreRefused(str(error)) from None
    finally:
        store.close()
