# `sessionstored rekey`: rotate the store's encryption key offline (the daemon
# must be stopped: the store's lock says so otherwise). Without --old-key-file
# it seals a plaintext store; without --new-key-file it unseals one. A run that
# is interrupted is finished by the next rekey with the same new key, or by the
# daemon's next start with either key.
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator, Sequence

from sessionstore.tools.helpformat import DefaultsShown

from .config import resolve_state_dir
from .keyfile import read_key_file
from .storage.errors import StoreFormatError, StoreLocked
from .storage.log.compaction import Progress
from .storage.log.fs import RealFileSystem
from .storage.log.metadata import read_metadata
from .storage.log.recovery import open_store
from .storage.log.rekey import begin_rekey
from .storage.sealing import Key, KeyFileError

EXIT_BAD_USAGE = 2
EXIT_FAILED = 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sessionstored rekey",
        description="Reseal every document of a stopped store under a new key, crash-safely.",
        formatter_class=DefaultsShown,
    )
    parser.add_argument("--state-dir", help="where the store lives")
    parser.add_argument("--old-key-file", help="the key the store is sealed with (none: plaintext)")
    parser.add_argument("--new-key-file", help="the key to seal it with (none: unseal it)")
    return parser


@contextlib.contextmanager
def _progress_bar() -> Iterator[Progress | None]:
    """A bar of documents resealed, on a terminal only (tqdm)."""
    if not sys.stderr.isatty():
        yield None
        return
    from tqdm import tqdm

    with tqdm(desc="resealing", unit=" documents", file=sys.stderr) as bar:

        def update(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        yield update


def _fail(message: str, code: int) -> int:
    print(f"sessionstored rekey: {message}", file=sys.stderr)
    return code


def rekey_main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    state_dir = resolve_state_dir(args.state_dir, os.environ)
    if not args.old_key_file and not args.new_key_file:
        return _fail("give --old-key-file, --new-key-file, or both", EXIT_BAD_USAGE)
    try:
        old = read_key_file(args.old_key_file) if args.old_key_file else None
        new = read_key_file(args.new_key_file) if args.new_key_file else None
    except KeyFileError as error:
        return _fail(str(error), EXIT_BAD_USAGE)
    new_id = new.key_id_hex if new else None
    if old is not None and new is not None and old.key_id == new.key_id:
        return _fail("the old and the new key are the same key", EXIT_BAD_USAGE)
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
            return _fail(
                f"an unfinished rotation {pending.describe()} is in the way; rerun it with "
                "that new key first",
                EXIT_FAILED,
            )
        opener: Key | None = new if pending is not None and new is not None else old
        store, report = open_store(fs, state_dir, key=opener)
        try:
            if pending is None:
                with _progress_bar() as progress:
                    done = f"resealed {begin_rekey(store, new, progress).resealed} documents"
            else:
                done = f"finished the rotation ({report.rekey_finished})"
        finally:
            store.close()
    except (StoreLocked, StoreFormatError) as error:
        return _fail(str(error), EXIT_FAILED)
    except OSError as error:
        return _fail(f"{state_dir}: {error}", EXIT_FAILED)
    old_name = f"key id {old.key_id_hex}" if old else "plaintext"
    new_name = f"key id {new_id}" if new else "plaintext"
    print(f"sessionstored rekey: {state_dir}: {old_name} -> {new_name}: {done}")
    return 0
