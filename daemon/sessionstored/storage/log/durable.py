# The one way a file is rewritten whole (an index checkpoint, a compacted log
# segment, FORMAT, the key-rotation marker): write a temp file under tmp/,
# fsync it, rename it over the target, fsync the target's directory. A crash at
# any step leaves the old file or the new one, never a mix, and at most a temp
# file that recovery sweeps.
from __future__ import annotations

from collections.abc import Callable

from .fs import FileSystem

TMP_DIR = "tmp"

Failpoint = Callable[[str], None]


def no_failpoint(_name: str) -> None:
    return None


def write_temp(fs: FileSystem, temp_path: str, chunks: list[bytes] | bytes) -> None:
    """A whole temp file, fsynced; on any error none of it is left behind."""

    def fill(fd: int) -> None:
        for chunk in [chunks] if isinstance(chunks, bytes) else chunks:
            fs.write(fd, chunk)

    _make_temp(fs, temp_path, fill)


def allocate_temp(fs: FileSystem, temp_path: str, size: int) -> None:
    """A temp file of size bytes of zeros, allocated (FileSystem.preallocate), fsynced;
    on any error none of it is left behind."""
    _make_temp(fs, temp_path, lambda fd: fs.preallocate(fd, size))


def _make_temp(fs: FileSystem, temp_path: str, fill: Callable[[int], None]) -> None:
    if fs.exists(temp_path):
        fs.unlink(temp_path)
    fd = fs.create_exclusive(temp_path)
    try:
        fill(fd)
        fs.fsync(fd)  # the new file is whole on disk before it can be named
    except OSError:
        fs.close(fd)
        fs.unlink(temp_path)  # a full disk must not keep half a file around
        raise
    fs.close(fd)


def install(
    fs: FileSystem, temp_path: str, target: str, failpoint: Failpoint = no_failpoint
) -> None:
    """Rename a synced temp file over target and make the name durable. An error at
    before-rename removes the temp and changes nothing."""
    try:
        failpoint("before-rename")
    except OSError:
        fs.unlink(temp_path)
        raise
    fs.rename(temp_path, target)  # atomic: the old file or the new one
    failpoint("after-rename")
    fs.fsync_dir(target.rsplit("/", 1)[0])  # the new name survives power loss


def replace_file(
    fs: FileSystem,
    root: str,
    target: str,
    data: list[bytes] | bytes,
    failpoint: Failpoint = no_failpoint,
) -> None:
    """temp, fsync, rename, fsync(dir): target (a path under root) now holds data."""
    temp = f"{root}/{TMP_DIR}/{target.rsplit('/', 1)[1]}.tmp"
    write_temp(fs, temp, data)
    install(fs, temp, target, failpoint)
