# The one seam between the storage engine and the operating system for data
# files. Everything the engine does to disk goes through a FileSystem, so the
# crash tests can swap in a simulated one that stops at any call and forgets
# whatever was not synced (tests/simfs.py).
from __future__ import annotations

import errno
import fcntl
import os
import stat
from typing import Protocol

from ..errors import FileTooLarge

ENOSPC_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class FileSystem(Protocol):
    def create_exclusive(self, path: str) -> int: ...
    def open_read_write(self, path: str) -> int: ...
    def open_read(self, path: str) -> int: ...
    def write(self, fd: int, data: bytes) -> None: ...
    def pwrite(self, fd: int, data: bytes, offset: int) -> None: ...
    def pread(self, fd: int, length: int, offset: int) -> bytes: ...
    # the file is `size` bytes of zeros, their blocks allocated, none of them written
    def preallocate(self, fd: int, size: int) -> None: ...
    def fsync(self, fd: int) -> None: ...
    def fdatasync(self, fd: int) -> None: ...
    def close(self, fd: int) -> None: ...
    def rename(self, source: str, target: str) -> None: ...
    def fsync_dir(self, path: str) -> None: ...
    def unlink(self, path: str) -> None: ...
    def listdir(self, path: str) -> list[str]: ...
    def mkdir(self, path: str) -> None: ...
    def rmdir(self, path: str) -> None: ...
    def is_dir(self, path: str) -> bool: ...
    def exists(self, path: str) -> bool: ...
    def file_size(self, path: str) -> int: ...
    def free_bytes(self, path: str) -> int | None: ...  # room left on its file system
    def read_file(self, path: str, max_bytes: int) -> bytes: ...
    def lock_exclusive(self, path: str) -> int | None: ...


class RealFileSystem:
    """The real OS. Never follows a symlink for a data file (O_NOFOLLOW)."""

    _FILE_FLAGS = os.O_CLOEXEC | os.O_NOFOLLOW

    def create_exclusive(self, path: str) -> int:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | self._FILE_FLAGS, 0o600)

    def open_read_write(self, path: str) -> int:
        return os.open(path, os.O_RDWR | self._FILE_FLAGS)

    def open_read(self, path: str) -> int:
        return os.open(path, os.O_RDONLY | self._FILE_FLAGS)

    def write(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]

    def pwrite(self, fd: int, data: bytes, offset: int) -> None:
        view = memoryview(data)
        while view:
            written = os.pwrite(fd, view, offset)
            view = view[written:]
            offset += written

    def preallocate(self, fd: int, size: int) -> None:
        os.posix_fallocate(fd, 0, size)  # glibc writes zeros where the file system cannot

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        data = os.pread(fd, length, offset)
        if len(data) == length:
            return data
        chunks = [data]
        got = len(data)
        while got < length:
            chunk = os.pread(fd, length - got, offset + got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    def rename(self, source: str, target: str) -> None:
        os.rename(source, target)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def mkdir(self, path: str) -> None:
        os.mkdir(path, 0o700)

    def rmdir(self, path: str) -> None:
        os.rmdir(path)

    def is_dir(self, path: str) -> bool:
        try:
            return stat.S_ISDIR(os.lstat(path).st_mode)
        except FileNotFoundError:
            return False

    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    def file_size(self, path: str) -> int:
        fd = os.open(path, os.O_RDONLY | self._FILE_FLAGS)
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def free_bytes(self, path: str) -> int | None:
        try:
            info = os.statvfs(path)
        except OSError:
            return None
        return info.f_bavail * info.f_frsize

    def read_file(self, path: str, max_bytes: int) -> bytes:
        fd = os.open(path, os.O_RDONLY | self._FILE_FLAGS)
        try:
            size = os.fstat(fd).st_size
            if size > max_bytes:
                raise FileTooLarge(errno.EFBIG, f"{size} bytes, over the cap of {max_bytes}", path)
            chunks = []
            remaining = size
            while remaining > 0:
                chunk = os.read(fd, remaining)
                if not chunk:
                    break
                chunks.append(chunk)
                remaining -= len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def lock_exclusive(self, path: str) -> int | None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | self._FILE_FLAGS, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd
