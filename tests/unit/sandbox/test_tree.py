"""Iterative tree walks over hostile shapes: deeper than Python's recursion limit and than the fds one walk keeps."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from gyre.errors import WorkspaceLimitExceeded
from gyre.sandbox import filetree
from gyre.sandbox.workspace import copy_tree

DEPTH = 3 * filetree.MAX_OPEN_FDS + 1500  # past the recursion limit, and reopening levels through ".."


def chain(root: Path, depth: int = DEPTH) -> None:
    """``depth`` nested directories ``d``, a file ``f`` at every 100th level (paths past PATH_MAX at the bottom)."""
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for i in range(depth):
        os.mkdir("d" * 3, dir_fd=fd)
        if i % 100 == 0:
            os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
        inner = os.open("d" * 3, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.symlink("/etc", "out", dir_fd=fd)
    os.close(fd)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_deep_trees_are_measured_copied_pruned_and_removed(tmp_path: Path) -> None:
    fds = open_fds()
    try:
        chain(tmp_path / "src")
        files = (DEPTH + 99) // 100
        assert filetree.usage(tmp_path / "src") == filetree.Usage(bytes=0, entries=DEPTH + files + 1)
        copied = filetree.copy(tmp_path / "src", tmp_path / "dest")
        assert copied == filetree.usage(tmp_path / "dest") == filetree.usage(tmp_path / "src")
        assert (
            filetree.prune(tmp_path / "dest", lambda rel: rel.count("/") == 50 and rel.endswith("ddd")) == 1
        )
        assert (
            filetree.usage(tmp_path / "dest").entries == 50 + 1
        )  # the 50 levels above the cut, and the top file
    finally:  # never leave pytest a tree its own (recursive) clean-up cannot remove
        filetree.remove(tmp_path / "src")
        filetree.remove(tmp_path / "dest")
    assert sorted(os.listdir(tmp_path)) == []
    assert open_fds() == fds


def test_limits_stop_a_walk_as_soon_as_they_are_passed(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    for i in range(20):
        (tmp_path / "ws" / str(i)).write_bytes(b"x" * 4096)  # a block each
    with pytest.raises(WorkspaceLimitExceeded, match="max_inodes") as inodes:
        filetree.usage(tmp_path / "ws", filetree.Limits(max_entries=10))
    assert inodes.value.resource == "inodes" and inodes.value.seen == 11
    with pytest.raises(WorkspaceLimitExceeded, match="disk_quota_mib"):
        filetree.copy(tmp_path / "ws", tmp_path / "out", filetree.Limits(max_bytes=20_000))
    with pytest.raises(WorkspaceLimitExceeded, match="copy_timeout_s"):
        filetree.copy(tmp_path / "ws", tmp_path / "out2", filetree.Limits(timeout_s=1e-9))
    used = filetree.Usage()
    filetree.usage(tmp_path / "ws", None, used)
    filetree.usage(tmp_path / "ws", None, used)  # two roots against one budget
    assert used == filetree.Usage(bytes=2 * 20 * 4096, entries=40)


def test_files_count_the_disk_they_use_and_holes_stay_holes(tmp_path: Path) -> None:
    """Three 900 MB sparse files use no disk: they fit a 1 MiB quota and copy in no time, holes kept (issue 31: the
    quota counted apparent sizes, and the execution was stopped for what it never wrote)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    for name in "abc":
        with open(ws / name, "wb") as f:
            f.truncate(900 << 20)
    with open(ws / "middle", "wb") as f:  # data between two holes
        f.seek(1 << 20)
        f.write(b"y" * 8192)
        f.truncate(3 << 20)
    (ws / "plain").write_bytes(b"z" * 4096)
    quota = filetree.Limits(max_bytes=1 << 20, timeout_s=30)
    used = filetree.usage(ws, quota)
    assert used == filetree.Usage(bytes=8192 + 4096, entries=5)
    copied = filetree.copy(ws, tmp_path / "by-descriptors", quota)
    asyncio.run(copy_tree(ws, tmp_path / "by-cp", quota))
    for out in (tmp_path / "by-descriptors", tmp_path / "by-cp"):
        assert filetree.usage(out) == used == copied
        for name in ("a", "middle", "plain"):
            assert (out / name).stat().st_size == (ws / name).stat().st_size
        assert (out / "middle").read_bytes() == (ws / "middle").read_bytes()
    with pytest.raises(WorkspaceLimitExceeded, match="disk_quota_mib"):
        filetree.usage(ws, filetree.Limits(max_bytes=8192))  # what the files hold still counts


@pytest.mark.skipif(os.geteuid() != 0, reason="making device files needs root")
def test_set_id_bits_and_devices_never_leave_a_tree(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "sub" / "su").write_bytes(b"#!/bin/sh\n")
    (ws / "sub" / "su").chmod(0o6755)
    (ws / "sub").chmod(0o2755)
    os.mknod(ws / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.mkfifo(ws / "fifo")
    copied = filetree.copy(ws, tmp_path / "out")
    assert sorted(os.listdir(tmp_path / "out")) == ["sub"] and copied.entries == 2  # no device, no fifo
    assert stat.S_IMODE((tmp_path / "out" / "sub" / "su").stat().st_mode) == 0o755
    assert filetree.sanitize(ws) == 3  # su, sub, null
    assert sorted(os.listdir(ws)) == ["fifo", "sub"]
    assert not (ws / "sub" / "su").stat().st_mode & (stat.S_ISUID | stat.S_ISGID)
    assert not (ws / "sub").stat().st_mode & stat.S_ISGID


def test_symlinks_are_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("mine")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "link").symlink_to(outside)
    (ws / "file_link").symlink_to(outside / "keep")
    assert filetree.usage(ws).entries == 2
    filetree.copy(ws, tmp_path / "out")
    assert os.readlink(tmp_path / "out" / "link") == str(outside)
    filetree.chown(ws, os.getuid(), os.getgid())
    filetree.remove(ws)
    assert (outside / "keep").read_text() == "mine" and not ws.exists()


def test_removal_gets_past_directories_without_permissions(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "a" / "b").mkdir(parents=True)
    (ws / "a" / "b" / "f").write_text("x")
    (ws / "a" / "b").chmod(0)
    (ws / "a").chmod(0o500)
    filetree.remove(ws)
    assert not ws.exists()


def test_the_verifiers_copy_is_bounded(tmp_path: Path) -> None:
    """`copy_tree` (cp -a) refuses a source over its bytes or entries before copying, and stops at its time."""
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(50):
        (ws / str(i)).write_bytes(b"x" * 8192)
    with pytest.raises(WorkspaceLimitExceeded, match="max_inodes"):
        asyncio.run(copy_tree(ws, tmp_path / "a", filetree.Limits(max_entries=49)))
    assert not (tmp_path / "a").exists()
    # a copy that cannot finish within its time: thousands of entries (tens of ms for cp) against 1 ms (a copy
    # of the 50 files above may finish before its timer is first looked at: that one is in time, not over it)
    many = tmp_path / "many"
    many.mkdir()
    for i in range(5000):
        (many / str(i)).touch()
    with pytest.raises(WorkspaceLimitExceeded, match="copy_timeout_s"):
        asyncio.run(copy_tree(many, tmp_path / "b", filetree.Limits(timeout_s=1e-3)))
    asyncio.run(
        copy_tree(ws, tmp_path / "c", filetree.Limits(max_bytes=409_600, max_entries=50, timeout_s=60))
    )
    assert filetree.usage(tmp_path / "c") == filetree.Usage(bytes=409_600, entries=50)
