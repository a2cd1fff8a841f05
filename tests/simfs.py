# An in-process simulated filesystem for crash-at-every-syscall tests.
#
# It models what POSIX promises and no more: file contents become durable only
# at fsync of that file; directory entries (creates, renames, unlinks) become
# durable only at fsync of that directory. crash() throws away everything that
# was not made durable, either all of it ("drop") or nothing ("keep": the OS
# happened to flush everything before power went out). Every call counts as a
# step; once the budget given to arm() is spent, the next call raises
# SimulatedCrash before doing anything. Directories themselves (mkdir) are
# modelled as durable at once; their entries are not.
#
# Power loss can also land only some of a file's unsynced pages, in any order:
# "torn-alternate" lands every other dirty 4 KiB page, "torn-last-only" only
# the last one, "torn-first-only" only the first (what a disk that writes
# pages out of order leaves of the last append).
from __future__ import annotations

import errno
import itertools
from dataclasses import dataclass, field

PAGE_BYTES = 4096
CRASH_MODES = ("drop", "keep", "torn-alternate", "torn-last-only", "torn-first-only")


class SimulatedCrash(Exception):
    pass


@dataclass
class _Inode:
    data: bytearray = field(default_factory=bytearray)
    durable: bytes = b""


@dataclass
class _Dir:
    entries: dict[str, int] = field(default_factory=dict)
    durable: dict[str, int] = field(default_factory=dict)


class SimFileSystem:
    def __init__(self) -> None:
        self._inodes: dict[int, _Inode] = {}
        self._dirs: dict[str, _Dir] = {"/": _Dir()}
        self._fds: dict[int, int] = {}
        self._next_ino = itertools.count(1)
        self._next_fd = itertools.count(100)
        self._budget: int | None = None
        self.steps = 0
        self.locked: set[str] = set()
        self.full_after_bytes: int | None = None
        self.fail_fsync_paths: set[str] = set()
        self._fd_paths: dict[int, str] = {}

    # -- test controls --------------------------------------------------

    def arm(self, steps: int | None) -> None:
        self._budget = steps

    def _step(self) -> None:
        self.steps += 1
        if self._budget is not None:
            if self._budget <= 0:
                raise SimulatedCrash(f"crash at step {self.steps}")
            self._budget -= 1

    def crash(self, mode: bool | str) -> None:
        """Power loss ("drop", or a torn mode) or a process kill ("keep"; True means that)."""
        mode = {True: "keep", False: "drop"}.get(mode, mode)  # type: ignore[call-overload]
        assert mode in CRASH_MODES, mode
        self._fds.clear()
        self._fd_paths.clear()
        self.locked.clear()
        self._budget = None
        if mode == "keep":
            for inode in self._inodes.values():
                inode.durable = bytes(inode.data)
            for directory in self._dirs.values():
                directory.durable = dict(directory.entries)
            return
        for inode in self._inodes.values():
            if mode != "drop" and len(inode.data) == len(inode.durable):
                inode.durable = _torn(inode.durable, bytes(inode.data), mode)
            inode.data = bytearray(inode.durable)
        for directory in self._dirs.values():
            directory.entries = dict(directory.durable)

    # -- helpers ----------------------------------------------------------

    @staticmethod
    def _split(path: str) -> tuple[str, str]:
        parent, _, name = path.rpartition("/")
        return parent or "/", name

    def _dir(self, path: str) -> _Dir:
        directory = self._dirs.get(path)
        if directory is None:
            raise FileNotFoundError(errno.ENOENT, "no such directory", path)
        return directory

    def _lookup(self, path: str) -> _Inode:
        parent, name = self._split(path)
        ino = self._dir(parent).entries.get(name)
        if ino is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        return self._inodes[ino]

    def _used_bytes(self) -> int:
        """Bytes of the files that a directory still names or a handle holds open."""
        live = {ino for d in self._dirs.values() for ino in d.entries.values()}
        live |= set(self._fds.values())
        return sum(len(self._inodes[ino].data) for ino in live)

    def _ino_at(self, path: str) -> int | None:
        parent, name = self._split(path)
        directory = self._dirs.get(parent)
        return directory.entries.get(name) if directory else None

    def makedirs_durable(self, path: str) -> None:
        self._dirs.setdefault(path, _Dir())

    def file_bytes(self, path: str) -> bytes:
        return bytes(self._lookup(path).data)

    def set_file_bytes(self, path: str, data: bytes) -> None:
        inode = self._lookup(path)
        inode.data = bytearray(data)
        inode.durable = bytes(data)

    def all_files(self) -> dict[str, bytes]:
        out = {}
        for dir_path, directory in self._dirs.items():
            for name, ino in directory.entries.items():
                out[f"{dir_path}/{name}"] = bytes(self._inodes[ino].data)
        return out

    # -- the FileSystem protocol -------------------------------------------

    def _new_fd(self, ino: int, path: str) -> int:
        fd = next(self._next_fd)
        self._fds[fd] = ino
        self._fd_paths[fd] = path
        return fd

    def open_read_write(self, path: str) -> int:
        self._step()
        parent, name = self._split(path)
        ino = self._dir(parent).entries.get(name)
        if ino is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        return self._new_fd(ino, path)

    def open_read(self, path: str) -> int:
        parent, name = self._split(path)
        ino = self._dir(parent).entries.get(name)
        if ino is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        return self._new_fd(ino, path)

    def create_exclusive(self, path: str) -> int:
        self._step()
        parent, name = self._split(path)
        directory = self._dir(parent)
        if name in directory.entries or path in self._dirs:
            raise FileExistsError(errno.EEXIST, "exists", path)
        ino = next(self._next_ino)
        self._inodes[ino] = _Inode()
        directory.entries[name] = ino
        return self._new_fd(ino, path)

    def write(self, fd: int, data: bytes) -> None:
        self._step()
        inode = self._inodes[self._fds[fd]]
        if self.full_after_bytes is not None:
            used = self._used_bytes()
            if used + len(data) > self.full_after_bytes:
                room = max(0, self.full_after_bytes - used)
                inode.data += data[:room]
                raise OSError(errno.ENOSPC, "No space left on device")
        inode.data += data

    def pwrite(self, fd: int, data: bytes, offset: int) -> None:
        self._step()
        inode = self._inodes[self._fds[fd]]
        end = offset + len(data)
        if end > len(inode.data):
            grow = end - len(inode.data)
            if self.full_after_bytes is not None:
                used = self._used_bytes()
                if used + grow > self.full_after_bytes:
                    raise OSError(errno.ENOSPC, "No space left on device")
            inode.data.extend(bytes(grow))
        inode.data[offset:end] = data

    def preallocate(self, fd: int, size: int) -> None:
        """As zeros written up to size (what the engine can tell apart is the same)."""
        inode = self._inodes[self._fds[fd]]
        if size > len(inode.data):
            self.pwrite(fd, bytes(size - len(inode.data)), len(inode.data))
        else:
            self._step()

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        return bytes(self._inodes[self._fds[fd]].data[offset : offset + length])

    def fdatasync(self, fd: int) -> None:
        self.fsync(fd)

    def fsync(self, fd: int) -> None:
        self._step()
        if self._fds[fd] in {self._ino_at(p) for p in self.fail_fsync_paths}:
            raise OSError(errno.EIO, "Input/output error")
        inode = self._inodes[self._fds[fd]]
        inode.durable = bytes(inode.data)

    def close(self, fd: int) -> None:
        self._fds.pop(fd, None)
        self.locked.discard(self._fd_paths.pop(fd, ""))

    def rename(self, source: str, target: str) -> None:
        self._step()
        if source in self._dirs:
            # directories are modelled as durable at once (only recovery renames one)
            self._dirs[target] = self._dirs.pop(source)
            return
        src_parent, src_name = self._split(source)
        dst_parent, dst_name = self._split(target)
        ino = self._dir(src_parent).entries.pop(src_name, None)
        if ino is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", source)
        self._dir(dst_parent).entries[dst_name] = ino

    def fsync_dir(self, path: str) -> None:
        self._step()
        if path in self.fail_fsync_paths:
            raise OSError(errno.EIO, "Input/output error")
        directory = self._dir(path)
        directory.durable = dict(directory.entries)

    def unlink(self, path: str) -> None:
        self._step()
        parent, name = self._split(path)
        if self._dir(parent).entries.pop(name, None) is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)

    def listdir(self, path: str) -> list[str]:
        directory = self._dir(path)
        children = [
            p.rsplit("/", 1)[1] for p in self._dirs if self._split(p)[0] == path and p != "/"
        ]
        return list(directory.entries) + children

    def mkdir(self, path: str) -> None:
        self._step()
        if path in self._dirs:
            raise FileExistsError(errno.EEXIST, "exists", path)
        self._dirs[path] = _Dir()

    def rmdir(self, path: str) -> None:
        self._step()
        if path not in self._dirs:
            raise FileNotFoundError(errno.ENOENT, "no such directory", path)
        if self._dirs[path].entries:
            raise OSError(errno.ENOTEMPTY, "directory not empty", path)
        del self._dirs[path]

    def is_dir(self, path: str) -> bool:
        return path in self._dirs

    def exists(self, path: str) -> bool:
        if path in self._dirs:
            return True
        parent, name = self._split(path)
        directory = self._dirs.get(parent)
        return directory is not None and name in directory.entries

    def free_bytes(self, path: str) -> int | None:
        if self.full_after_bytes is None:
            return None
        return max(0, self.full_after_bytes - self._used_bytes())

    def file_size(self, path: str) -> int:
        return len(self._lookup(path).data)

    def read_file(self, path: str, max_bytes: int) -> bytes:
        data = self._lookup(path).data
        if len(data) > max_bytes:
            raise OSError(errno.EFBIG, "too large", path)
        return bytes(data)

    def lock_exclusive(self, path: str) -> int | None:
        if path in self.locked:
            return None
        self.locked.add(path)
        parent, name = self._split(path)
        directory = self._dir(parent)
        if name not in directory.entries:
            ino = next(self._next_ino)
            self._inodes[ino] = _Inode()
            directory.entries[name] = ino
        return self._new_fd(directory.entries[name], path)


def _torn(durable: bytes, data: bytes, mode: str) -> bytes:
    """What a disk that lands only some dirty pages leaves: durable, with those pages new."""
    dirty = [
        start
        for start in range(0, len(data), PAGE_BYTES)
        if data[start : start + PAGE_BYTES] != durable[start : start + PAGE_BYTES]
    ]
    if mode == "torn-alternate":
        landing = dirty[::2]
    elif mode == "torn-last-only":
        landing = dirty[-1:]
    else:
        landing = dirty[:1]
    out = bytearray(durable)
    for start in landing:
        out[start : start + PAGE_BYTES] = data[start : start + PAGE_BYTES]
    return bytes(out)
