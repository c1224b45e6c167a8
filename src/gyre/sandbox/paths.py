"""Workspace paths opened from the host exactly as the sandbox would see them, and never outside the workspace.

The sandbox controls its workspace's contents, including symlinks, and may change them while the host reads. So a
path is never resolved with the host's view (an absolute symlink target means a path *inside* the sandbox) nor
checked first and opened later: it is walked one component at a time from an open directory descriptor of the
workspace, each step opened with ``O_NOFOLLOW``. A symlink met on the way is expanded with the sandbox's meaning
(absolute targets must lie under ``WORKSPACE``), and ``..`` never climbs above the workspace. Only regular files are
read or written (a FIFO would block the reader forever; ``O_NONBLOCK`` keeps even the open from blocking).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from gyre.errors import SandboxError

_MAX_SYMLINKS = 40  # as Linux allows in one path walk
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def split_path(path: str, workspace: str) -> list[str]:
    """The components of ``path`` relative to the workspace root (``..`` kept: the walk resolves it).

    ``path`` is relative to the workspace or absolute under ``workspace`` (the in-sandbox path).
    """
    if not isinstance(path, str):
        raise SandboxError(f"a sandbox path must be a str, not {type(path).__name__}")
    if "\0" in path:
        raise SandboxError(f"path {path!r} contains a NUL byte")
    if not path.startswith("/"):
        return [p for p in path.split("/") if p not in ("", ".")]
    prefix = [p for p in workspace.split("/") if p]
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if parts[: len(prefix)] != prefix:
        raise SandboxError(f"path {path!r} is outside the workspace {workspace}")
    return parts[len(prefix) :]


def _symlink_parts(target: str, workspace: str, shown: str) -> tuple[bool, list[str]]:
    """(restart from the root?, components) of a symlink's target as the sandbox resolves it."""
    if target.startswith("/"):
        try:
            return True, split_path(target, workspace)
        except SandboxError:
            raise SandboxError(f"{shown} is a symlink to {target}, outside the workspace") from None
    return False, [p for p in target.split("/") if p not in ("", ".")]


def _open_in(root: Path, path: str, workspace: str, *, write: bool, mode: int = 0o644) -> int:
    """An open descriptor of the regular file ``path`` names in the workspace at ``root``."""
    pending = split_path(path, workspace)
    pending.reverse()  # a stack: the next component is pending[-1]
    if not pending:
        raise SandboxError(f"{path!r} is the workspace directory, not a file")
    stack = [os.open(root, _DIR_FLAGS)]  # resolved, real directories; stack[0] is the workspace
    links = 0
    try:
        while pending:
            name = pending.pop()
            if name == "..":
                if len(stack) == 1:
                    raise SandboxError(f"path {path!r} leads outside the workspace")
                os.close(stack.pop())
                continue
            last = not pending
            flags = (_WRITE_FLAGS if write else _READ_FLAGS) if last else _DIR_FLAGS
            try:
                fd = os.open(name, flags, mode, dir_fd=stack[-1])
            except FileNotFoundError:
                if last or not write:
                    raise SandboxError(f"{path!r}: no such file in the workspace") from None
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=stack[-1])
                pending.append(name)  # open the new (or raced-in) entry on the next turn
                continue
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    raise SandboxError(f"{path!r}: {exc.strerror}") from None
                fd = -1  # a symlink (or a file where a directory was needed): below
            if fd < 0:
                links += 1
                if links > _MAX_SYMLINKS:
                    raise SandboxError(f"{path!r}: too many levels of symbolic links")
                restart, parts = _symlink_parts(_readlink(name, stack[-1], path), workspace, repr(path))
                if restart:
                    while len(stack) > 1:
                        os.close(stack.pop())
                if not parts and not pending:  # a link to the workspace directory itself
                    raise SandboxError(f"{path!r} is a directory, not a file")
                pending.extend(reversed(parts))
                continue
            if last:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    os.close(fd)
                    raise SandboxError(f"{path!r} is not a regular file")
                return fd
            stack.append(fd)
        raise SandboxError(f"{path!r} is a directory, not a file")
    finally:
        for fd in stack:
            os.close(fd)


def _readlink(name: str, dir_fd: int, path: str) -> str:
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError:  # not a symlink: a file where a directory was needed
        raise SandboxError(f"{path!r}: {name!r} is not a directory") from None


def read_file(root: Path, path: str, workspace: str) -> bytes:
    """The bytes of the workspace file ``path`` (blocking: call it in a thread)."""
    fd = _open_in(root, path, workspace, write=False)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_file(root: Path, path: str, workspace: str, data: bytes, owner: int | None = None) -> None:
    """Create or replace the workspace file ``path``; ``owner`` (uid = gid) is given every entry created."""
    if owner is not None:
        _create_parents_owned(root, path, workspace, owner)
    fd = _open_in(root, path, workspace, write=True)
    try:
        os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if owner is not None:
            os.fchown(fd, owner, owner)
    finally:
        os.close(fd)


def _create_parents_owned(root: Path, path: str, workspace: str, owner: int) -> None:
    """Create the missing parents of a plain (symlink-free) ``path`` owned by ``owner``; others walk as usual."""
    parts = split_path(path, workspace)[:-1]
    if ".." in parts:
        return
    fd = os.open(root, _DIR_FLAGS)
    try:
        for name in parts:
            try:
                os.mkdir(name, 0o755, dir_fd=fd)
                os.chown(name, owner, owner, dir_fd=fd, follow_symlinks=False)
            except FileExistsError:
                pass
            try:
                nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                return  # a symlink or a file: the checked walk of _open_in decides
            os.close(fd)
            fd = nxt
    finally:
        os.close(fd)
