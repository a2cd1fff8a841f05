# `sessionstored rekey`: rotate the store's encryption key.
#
# The embedded log (--state-dir) is rekeyed offline: the daemon must be stopped
# (the store's lock says so otherwise). Without --old-key-file it seals a
# plaintext store; without --new-key-file it unseals one. A run that is
# interrupted is finished by the next rekey with the same new key, or by the
# daemon's next start with either key.
#
# A PostgreSQL store (--database) is rekeyed online, from one key to another,
# while its daemons serve (storage/postgres/rekey.py); each must hold both keys
# first (--key-file and --previous-key-file). A run that is interrupted is
# resumed by the next with the same keys.
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator, Sequence

from sessionstore.tools.helpformat import DefaultsShown, OneLineUsage

from ..config import resolve_state_dir
from ..exit_codes import ExitCode, refuse
from ..storage.errors import KeyFileError, StoreFormatError, StoreLocked
from ..storage.log.compaction import Progress
from ..storage.log.fs import RealFileSystem
from ..storage.log.metadata import read_metadata
from ..storage.log.recovery import open_store
from ..storage.log.rekey import begin_rekey
from ..storage.sealing import Key
from .keyfile import read_key_file

PROGRAM = "sessionstored rekey"


def _parser() -> argparse.ArgumentParser:
    from ..storage.postgres.rekey import ROWS_PER_TRANSACTION

    parser = OneLineUsage(
        prog="sessionstored rekey",
        description="Reseal every document under a new key, crash-safely: a stopped log "
        "store, or PostgreSQL online.",
        formatter_class=DefaultsShown,
    )
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--state-dir", help="where the store lives (stopped)")
    target.add_argument(
        "--database",
        metavar="URL",
        help="rotate a sealed PostgreSQL store online instead (the password from "
        "SESSIONSTORED_DATABASE_PASSWORD)",
    )
    parser.add_argument(
        "--rows-per-transaction",
        type=int,
        default=ROWS_PER_TRANSACTION,
        help="PostgreSQL: rows resealed per transaction, batches waiting for each",
    )
    parser.add_argument("--old-key-file", help="the key the store is sealed with (none: plaintext)")
    parser.add_argument("--new-key-file", help="the key to seal it with (none: unseal it)")
    return parser


@contextlib.contextmanager
def _progress_bar(unit: str = " documents") -> Iterator[Progress | None]:
    """A bar of what is resealed, on a terminal only (tqdm)."""
    if not sys.stderr.isatty():
        yield None
        return
    from tqdm import tqdm

    with tqdm(desc="resealing", unit=unit, file=sys.stderr) as bar:

        def update(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        yield update


def rekey_main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    if not args.old_key_file and not args.new_key_file:
        return refuse(PROGRAM, "give --old-key-file, --new-key-file, or both", ExitCode.BAD_USAGE)
    if args.rows_per_transaction < 1:
        return refuse(PROGRAM, "--rows-per-transaction must be at least 1", ExitCode.BAD_USAGE)
    try:
        old = read_key_file(args.old_key_file) if args.old_key_file else None
        new = read_key_file(args.new_key_file) if args.new_key_file else None
    except KeyFileError as error:
        return refuse(PROGRAM, str(error), ExitCode.BAD_USAGE)
    new_id = new.key_id_hex if new else None
    if old is not None and new is not None and old.key_id == new.key_id:
        return refuse(PROGRAM, "the old and the new key are the same key", ExitCode.BAD_USAGE)
    if args.database:
        if old is None or new is None:
            return refuse(
                PROGRAM,
                "a PostgreSQL store rotates from one key to another: give --old-key-file and "
                "--new-key-file (to seal or unseal one, back it up and restore it)",
                ExitCode.BAD_USAGE,
            )
        return _rekey_database(args.database, old, new, args.rows_per_transaction)
    state_dir = resolve_state_dir(args.state_dir, os.environ)
    try:
        fs = RealFileSystem()
        metadata = read_metadata(fs, state_dir)
        pending = metadata.bridge
        if pending is None and metadata.exists and metadata.sealed_with == new_id:
            print(
                f"sessionstored rekey: {state_dir}: already sealed with the new key; nothing to do"
            )
            return 0
        if pending is not None and pending.to_id != new_id:
            return refuse(
                PROGRAM,
                f"an unfinished rotation {pending.describe()} is in the way; rerun it with "
                "that new key first",
                ExitCode.FAILED,
            )
        opener: Key | None = new if pending is not None and new is not None else old
        store, report = open_store(fs, state_dir, key=opener)
        try:
            if pending is None:
                with _progress_bar() as progress:
                    done = f"resealed {begin_rekey(store, new, progress).describe()}"
            else:
                done = f"finished the rotation ({report.rekey_finished})"
        finally:
            store.close()
    except (StoreLocked, StoreFormatError) as error:
        return refuse(PROGRAM, str(error), ExitCode.FAILED)
    except OSError as error:
        return refuse(PROGRAM, f"{state_dir}: {error}", ExitCode.FAILED)
    old_name = f"key id {old.key_id_hex}" if old else "plaintext"
    new_name = f"key id {new_id}" if new else "plaintext"
    print(f"sessionstored rekey: {state_dir}: {old_name} -> {new_name}: {done}")
    return 0


def _rekey_database(url: str, old: Key, new: Key, rows_per_transaction: int) -> int:
    import psycopg

    from ..storage.errors import DatabaseRefused, DatabaseUnreachable, RekeyRefused
    from ..storage.postgres.connection import redacted
    from ..storage.postgres.store import PgStore

    password = os.environ.get("SESSIONSTORED_DATABASE_PASSWORD")
    store = PgStore(url, key=new, previous_key=old, password=password)
    try:
        with _progress_bar(" rows") as progress:
            result = store.rekey(
                old,
                new,
                rows_per_transaction=rows_per_transaction,
                progress=progress,
            )
    except (RekeyRefused, DatabaseRefused, DatabaseUnreachable) as error:
        return refuse(PROGRAM, str(error), ExitCode.FAILED)
    except psycopg.Error as error:
        return refuse(
            PROGRAM, f"{redacted(url)}: {str(error).strip().splitlines()[0]}", ExitCode.FAILED
        )
    finally:
        store.close()
    where = f"{redacted(url)}: key id {old.key_id_hex} -> key id {new.key_id_hex}"
    if result.already:
        print(f"sessionstored rekey: {where}: already sealed with the new key; nothing to do")
        return 0
    resumed = " (resumed an unfinished rotation)" if result.resumed else ""
    print(
        f"sessionstored rekey: {where}: resealed {result.documents} documents, "
        f"{result.generations} earlier generations and {result.changes} changes{resumed}"
    )
    return 0
