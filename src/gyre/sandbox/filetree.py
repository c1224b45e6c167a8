"""Walking, measuring, copying and removing directory trees a sandbox wrote, without trusting their shape.

A workspace is hostile input: any depth (a chain of 100,000 directories), any width, symlinks anywhere, special
files, set-id bits, and, while its agent runs, entries changing under the walk. Everything here is iterative (an
explicit stack, never Python recursion), works through directory fds (``*at`` calls, so no path is ever longer
than one name and no symlink is followed), keeps at most `MAX_OPEN_FDS` directory fds open whatever the depth
(deeper levels are reopened through ``..`` and checked against the device and inode seen on the way down), and
stops at its limits (`Limits`) with `WorkspaceLimitExceeded`. All functions block: run them in a thread.

- `usage` measures a tree (disk space its files use, entries) and stops as soon as a limit is passed;
- `copy` copies directories, regular files (holes stay holes) and symlinks (as links), nothing else, dropping
  set-id bits;
- `sanitize` strips set-id bits and deletes device files in place (before the host uses a workspace);
- `remove` deletes a tree (`empty`: its contents); `prune` deletes the entries a predicate picks;
- `walk` yields every entry (with an fd of its directory, for ``*at`` calls); `chown` gives a tree to a uid.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from gyre.errors import SandboxError, WorkspaceLimitExceeded

MAX_OPEN_FDS = 32  # directory fds one walk keeps open; deeper levels are reopened through ".."
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_SETID = stat.S_ISUID | stat.S_ISGID
_COPY_CHUNK = 8 << 20  # bytes per sendfile call (the copy's deadline is checked between chunks)


@dataclass(frozen=True)
class Limits:
    """What one tree may hold, and how long a copy of it may take; None: no limit."""

    # disk space regular files use (allocated blocks: a sparse file's holes are free, preallocated space is not;
    # what a copy writes, since it keeps holes)
    max_bytes: int | None = None
    max_entries: int | None = None  # files, directories, links and other entries, the root excluded
    timeout_s: float | None = None  # wall clock of one `copy`


@dataclass
class Usage:
    """What a walk saw: bytes of disk regular files use (their blocks) and entries (the root excluded).

    Blocks, not apparent sizes: three 900 MB sparse files use no disk and copy in no time (issue 31: counting
    them by size stopped an execution for what it never wrote), and a file preallocated past its size uses what it
    holds."""

    bytes: int = 0
    entries: int = 0

    def add(self, st: os.stat_result, limits: Limits | None) -> None:
        """Count one entry; `WorkspaceLimitExceeded` once a limit is passed."""
        self.entries += 1
        if stat.S_ISREG(st.st_mode):
            self.bytes += st.st_blocks * 512  # st_blocks counts 512-byte units whatever the block size
        if limits is None:
            return
        if limits.max_entries is not None and self.entries > limits.max_entries:
            raise WorkspaceLimitExceeded("inodes", limits.max_entries, self.entries)
        if limits.max_bytes is not None and self.bytes > limits.max_bytes:
            raise WorkspaceLimitExceeded("disk", limits.max_bytes, self.bytes)


@dataclass
class _Level:
    """One directory on the walk's stack: its fd (None when closed to save fds), identity and pending names."""

    name: str  # in its parent ("" for the root)
    ident: tuple[int, int]  # (st_dev, st_ino)
    fd: int | None
    names: list[str]
    index: int = 0


@dataclass
class _Stack:
    """The open directories from the root to the current one, at most `MAX_OPEN_FDS` of them holding an fd."""

    levels: list[_Level] = field(default_factory=list)
    first_open: int = 0  # levels below this index have their fd closed

    @property
    def top(self) -> _Level:
        return self.levels[-1]

    @property
    def fd(self) -> int:
        fd = self.top.fd
        assert fd is not None  # the top level is never evicted
        return fd

    def push_fd(self, name: str, fd: int, list_names: bool = True) -> _Level:
        """Make the directory open at ``fd`` (``name`` in the current one) the new top; the stack owns ``fd``."""
        try:
            st = os.fstat(fd)
            names = sorted(os.listdir(fd)) if list_names else []
        except OSError:
            os.close(fd)
            raise
        level = _Level(name, (st.st_dev, st.st_ino), fd, names)
        self.levels.append(level)
        if len(self.levels) - self.first_open > MAX_OPEN_FDS:
            evicted = self.levels[self.first_open]
            if evicted.fd is not None:
                os.close(evicted.fd)
                evicted.fd = None
            self.first_open += 1
        return level

    def pop(self) -> _Level:
        """Close the top directory and make its parent (reopened through ``..`` if needed) the top."""
        child = self.levels.pop()
        try:
            if self.levels and self.top.fd is None:
                fd = os.open("..", _DIR_FLAGS, dir_fd=child.fd)
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) != self.top.ident:
                    os.close(fd)
                    raise SandboxError("a directory was moved during a walk of its tree")
                self.top.fd = fd
                self.first_open = len(self.levels) - 1
        finally:
            if child.fd is not None:
                os.close(child.fd)
        return child

    def close(self) -> None:
        for level in self.levels:
            if level.fd is not None:
                os.close(level.fd)
        self.levels.clear()

    def relpath(self, name: str) -> str:
        """``name``'s path relative to the root (costs the depth)."""
        return "/".join([*(level.name for level in self.levels[1:]), name])


def _open_root(path: Path | str) -> int:
    try:
        return os.open(path, _DIR_FLAGS)
    except OSError as exc:
        raise SandboxError(f"cannot open the directory {path}: {exc.strerror}") from None


def _walk(
    root: Path | str, descend: Callable[[_Stack, str, os.stat_result], bool] | None = None
) -> Iterator[tuple[_Stack, str, os.stat_result | None]]:
    """Every entry under ``root``, top-down: (stack, name, lstat) with ``stack.fd`` its directory's fd, then
    (stack, "", None) when a directory is done (its fd still the top). Entries that vanish are skipped.
    ``descend(stack, name, st)`` says whether to enter a directory (default: always)."""
    stack = _Stack()
    stack.push_fd("", _open_root(root))
    try:
        while stack.levels:
            level = stack.top
            if level.index >= len(level.names):
                yield stack, "", None
                stack.pop()
                continue
            name = level.names[level.index]
            level.index += 1
            try:
                st = os.stat(name, dir_fd=stack.fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            yield stack, name, st
            if stat.S_ISDIR(st.st_mode) and (descend is None or descend(stack, name, st)):
                try:
                    fd = os.open(name, _DIR_FLAGS, dir_fd=stack.fd)
                except (FileNotFoundError, NotADirectoryError):  # gone, or swapped for something else
                    continue
                except OSError as exc:
                    if exc.errno == errno.ELOOP:  # swapped for a symlink: never followed
                        continue
                    raise
                try:
                    stack.push_fd(name, fd)
                except FileNotFoundError:
                    continue
    finally:
        stack.close()


@dataclass(frozen=True)
class Entry:
    """One entry of a `walk`: act on it through ``dir_fd`` (``os.chown(e.name, ..., dir_fd=e.dir_fd,
    follow_symlinks=False)``), which is open only until the walk moves on."""

    dir_fd: int  # its directory
    name: str
    stat: os.stat_result  # lstat: a symlink is itself
    _stack: _Stack

    @property
    def depth(self) -> int:
        """1 for the root's own entries."""
        return len(self._stack.levels)

    def relpath(self) -> str:
        """Its path relative to the root, ``a/b/c`` (costs its depth)."""
        return self._stack.relpath(self.name)


def walk(root: Path | str, descend: Callable[[Entry], bool] | None = None) -> Iterator[Entry]:
    """Every entry under ``root``, top-down, never following a symlink; entries that vanish meanwhile are skipped.
    ``descend(entry)`` says whether to enter a directory (default: always). Deleting the entry just yielded, or
    anything in its directory, is safe (each directory is listed before its entries are yielded)."""

    def enter(stack: _Stack, name: str, st: os.stat_result) -> bool:
        return descend is None or descend(Entry(stack.fd, name, st, stack))

    for stack, name, st in _walk(root, enter if descend is not None else None):
        if st is not None:
            yield Entry(stack.fd, name, st, stack)


def chown(root: Path | str, uid: int, gid: int) -> None:
    """Give ``root`` and everything under it to ``uid``:``gid`` (symlinks themselves, never their targets)."""
    os.chown(root, uid, gid, follow_symlinks=False)
    for entry in walk(root):
        with contextlib.suppress(FileNotFoundError):
            os.chown(entry.name, uid, gid, dir_fd=entry.dir_fd, follow_symlinks=False)


def usage(root: Path | str, limits: Limits | None = None, used: Usage | None = None) -> Usage:
    """Bytes and entries under ``root`` (added to ``used``, to measure several roots against one limit); stops with
    `WorkspaceLimitExceeded` once past ``limits``."""
    used = used if used is not None else Usage()
    for _, _name, st in _walk(root):
        if st is not None:
            used.add(st, limits)
    return used


def sanitize(root: Path | str, limits: Limits | None = None, used: Usage | None = None) -> int:
    """Strip set-user-id and set-group-id bits and delete device files under ``root`` (and the root's own bits):
    nothing a sandbox wrote may become a privilege on the host. Returns how many entries it changed. Measures the
    tree on the way (into ``used``; `WorkspaceLimitExceeded` past ``limits``, the rest left unsanitized)."""
    changed = 0
    used = used if used is not None else Usage()
    fd = _open_root(root)
    try:
        mode = os.fstat(fd).st_mode
        if mode & _SETID:
            os.fchmod(fd, stat.S_IMODE(mode) & ~_SETID)
            changed += 1
    finally:
        os.close(fd)
    for stack, name, st in _walk(root):
        if st is None:
            continue
        used.add(st, limits)
        if stat.S_ISLNK(st.st_mode):
            continue
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=stack.fd)
            changed += 1
        elif st.st_mode & _SETID:
            try:
                fd = os.open(
                    name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=stack.fd
                )
            except FileNotFoundError:
                continue
            try:
                os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode) & ~_SETID)
            finally:
                os.close(fd)
            changed += 1
    return changed


def copy(src: Path | str, dest: Path | str, limits: Limits | None = None) -> Usage:
    """Copy the tree ``src`` into the directory ``dest`` (made if missing): directories, regular files and
    symlinks (as links), with their permission bits less set-id bits and their modification times; devices,
    fifos and sockets are left out. `WorkspaceLimitExceeded` when it would pass ``limits`` (what was copied
    stays: the caller removes ``dest``)."""
    deadline = None if limits is None or limits.timeout_s is None else time.monotonic() + limits.timeout_s
    used = Usage()
    os.makedirs(dest, exist_ok=True)
    out = _Stack()
    out.push_fd("", _open_root(dest), list_names=False)
    try:
        for stack, name, st in _walk(src):
            if deadline is not None and time.monotonic() > deadline:
                raise WorkspaceLimitExceeded("time", (limits and limits.timeout_s) or 0, used.bytes)
            while len(out.levels) > len(stack.levels):  # a directory that could not be entered
                out.pop()
            if st is None:  # a directory is done
                if len(out.levels) > 1:
                    _finish_dir(out, stack)
                continue
            mode = st.st_mode
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
                continue
            used.add(st, limits)
            try:
                if stat.S_ISDIR(mode):
                    os.mkdir(name, 0o700, dir_fd=out.fd)
                    out.push_fd(name, os.open(name, _DIR_FLAGS, dir_fd=out.fd), list_names=False)
                elif stat.S_ISLNK(mode):
                    os.symlink(os.readlink(name, dir_fd=stack.fd), name, dir_fd=out.fd)
                else:
                    _copy_file(stack.fd, name, out.fd, st, deadline, limits)
            except FileNotFoundError:
                continue
    finally:
        out.close()
    return used


def _finish_dir(out: _Stack, stack: _Stack) -> None:
    """Give a copied directory its source's mode and times, then leave it."""
    src_st = os.fstat(stack.fd)
    os.fchmod(out.fd, stat.S_IMODE(src_st.st_mode) & ~_SETID | stat.S_IRWXU)
    os.utime(out.fd, ns=(src_st.st_atime_ns, src_st.st_mtime_ns))
    out.pop()


def _copy_file(
    src_dir: int, name: str, dest_dir: int, st: os.stat_result, deadline: float | None, limits: Limits | None
) -> None:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=src_dir)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since it was listed
            return
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        out = os.open(name, flags, 0o600, dir_fd=dest_dir)
        try:
            for start, end in _data_extents(fd, st.st_size):
                offset = start
                while offset < end:
                    if deadline is not None and time.monotonic() > deadline:
                        raise WorkspaceLimitExceeded("time", (limits and limits.timeout_s) or 0, offset)
                    os.lseek(out, offset, os.SEEK_SET)
                    sent = os.sendfile(out, fd, offset, min(_COPY_CHUNK, end - offset))
                    if sent == 0:  # truncated since it was measured
                        break
                    offset += sent
            os.ftruncate(out, min(st.st_size, os.fstat(fd).st_size))  # a trailing hole, or a file cut since
            os.fchmod(out, stat.S_IMODE(st.st_mode) & ~_SETID)
            os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(out)
    finally:
        os.close(fd)


def _data_extents(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """The ``[start, end)`` ranges of ``fd`` below ``size`` that hold data (the whole file where the filesystem
    cannot tell holes apart)."""
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole from here on
                return
            if offset == 0 and exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
                yield 0, size
            return
        if start >= size:
            return
        try:
            end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        except OSError:
            end = size
        yield start, end
        offset = end


def remove(path: Path | str) -> None:
    """Delete ``path`` and everything under it (a missing path is fine; a symlink is removed, never followed),
    even directories a command left without write or search permission."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        empty(path)
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(path)
    else:
        os.unlink(path)


def empty(path: Path | str) -> None:
    """Delete everything inside the directory ``path`` (symlinks are removed, never followed)."""
    _empty_fd(_open_dir_forcing(None, str(path)))


def prune(root: Path | str, match: Callable[[str], bool]) -> int:
    """Delete every entry under ``root`` whose path relative to it (``a/b/c``) ``match`` picks; a picked
    directory goes whole, unvisited. Returns how many were picked. Costs the depth per entry (its path)."""
    deleted = 0

    def descend(stack: _Stack, name: str, st: os.stat_result) -> bool:
        return not match(stack.relpath(name))

    for stack, name, st in _walk(root, descend):
        if st is None or not match(stack.relpath(name)):
            continue
        deleted += 1
        parent = stack.fd
        if stat.S_ISDIR(st.st_mode):
            try:
                _empty_fd(_open_dir_forcing(parent, name))
            except FileNotFoundError:
                continue
            _retry_writable(parent, functools.partial(os.rmdir, name, dir_fd=parent))
        else:
            _retry_writable(parent, functools.partial(os.unlink, name, dir_fd=parent))
    return deleted


def _empty_fd(fd: int) -> None:
    """Delete everything inside the directory open at ``fd`` (closed here), deepest entries first."""
    stack = _Stack()
    stack.push_fd("", fd)
    try:
        while stack.levels:
            level = stack.top
            if level.index >= len(level.names):
                done = stack.pop()
                if stack.levels:
                    parent = stack.fd
                    _retry_writable(parent, functools.partial(os.rmdir, done.name, dir_fd=parent))
                continue
            name = level.names[level.index]
            level.index += 1
            parent = stack.fd
            try:
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if not stat.S_ISDIR(st.st_mode):
                _retry_writable(parent, functools.partial(os.unlink, name, dir_fd=parent))
                continue
            try:
                stack.push_fd(name, _open_dir_forcing(parent, name))
            except FileNotFoundError:
                continue
    finally:
        stack.close()


def _open_dir_forcing(dir_fd: int | None, name: str) -> int:
    """Open a directory to delete its contents, granting ourselves search and read permission if it lacks them."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except PermissionError:
        os.chmod(name, 0o700, dir_fd=dir_fd)  # a directory: O_NOFOLLOW said ELOOP, not EACCES, for a symlink
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    try:
        os.listdir(fd)
    except PermissionError:
        os.fchmod(fd, 0o700)
    return fd


def _retry_writable(dir_fd: int, op: Callable[[], None]) -> None:
    """Run a deletion in the directory ``dir_fd``; on EACCES make the directory writable and retry once."""
    try:
        op()
    except FileNotFoundError:
        return
    except PermissionError:
        os.fchmod(dir_fd, 0o700)
        with contextlib.suppress(FileNotFoundError):
            op()
