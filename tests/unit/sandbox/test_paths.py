"""gyre.sandbox.paths: workspace paths resolve as the sandbox sees them and never leave the workspace."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gyre.errors import SandboxError
from gyre.sandbox.paths import read_file, split_path, write_file

WS = "/workspace"


def test_split_path_accepts_relative_and_workspace_absolute_paths() -> None:
    assert split_path("a/b.txt", WS) == ["a", "b.txt"]
    assert split_path("./a//b/./c", WS) == ["a", "b", "c"]
    assert split_path("/workspace/a/b", WS) == ["a", "b"]
    assert split_path("/workspace", WS) == []
    assert split_path("a/../b", WS) == ["a", "..", "b"]  # resolved by the walk, which knows about symlinks


@pytest.mark.parametrize("path", ["/etc/passwd", "/workspacex/a", "/", "/tmp/x", "a\0b"])
def test_split_path_rejects_paths_outside_the_workspace(path: str) -> None:
    with pytest.raises(SandboxError):
        split_path(path, WS)


def test_write_then_read_creates_parent_directories(tmp_path: Path) -> None:
    write_file(tmp_path, "a/b/c.txt", WS, b"hello")
    assert (tmp_path / "a/b/c.txt").read_bytes() == b"hello"
    assert read_file(tmp_path, "/workspace/a/b/c.txt", WS) == b"hello"
    write_file(tmp_path, "a/b/c.txt", WS, b"hi")  # replaced, not appended
    assert read_file(tmp_path, "a/b/c.txt", WS) == b"hi"


@pytest.mark.parametrize("path", ["..", "../x", "a/../../x", "/workspace/../etc/passwd"])
def test_dot_dot_cannot_climb_out(tmp_path: Path, path: str) -> None:
    ws = tmp_path / "ws"
    (ws / "a").mkdir(parents=True)
    (tmp_path / "x").write_text("secret")
    with pytest.raises(SandboxError):
        read_file(ws, path, WS)
    with pytest.raises(SandboxError):
        write_file(ws, path, WS, b"pwned")
    assert (tmp_path / "x").read_text() == "secret"


def test_dot_dot_inside_the_workspace_is_fine(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b.txt").write_text("b")
    assert read_file(tmp_path, "a/../b.txt", WS) == b"b"


def test_symlinks_pointing_out_are_refused_for_read_and_write(tmp_path: Path) -> None:
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    (outside / "secret").write_text("secret")
    os.symlink(outside / "secret", ws / "abs")  # the host path: outside the workspace as the sandbox sees it
    os.symlink("/etc/passwd", ws / "etc")
    os.symlink("../outside/secret", ws / "rel")
    os.symlink(outside, ws / "dir")
    for name in ("abs", "etc", "rel", "dir/secret", "dir/new"):
        with pytest.raises(SandboxError):
            read_file(ws, name, WS)
        with pytest.raises(SandboxError):
            write_file(ws, name, WS, b"pwned")
    assert (outside / "secret").read_text() == "secret"
    assert not (outside / "new").exists()


def test_symlinks_inside_resolve_with_the_sandbox_meaning(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real/f").write_text("f")
    os.symlink("/workspace/real", tmp_path / "abs")  # dangling on the host, fine inside the sandbox
    os.symlink("real", tmp_path / "rel")
    os.symlink("/workspace/real/new", tmp_path / "dangling")
    assert read_file(tmp_path, "abs/f", WS) == b"f"
    assert read_file(tmp_path, "rel/f", WS) == b"f"
    assert read_file(tmp_path, "abs/../real/f", WS) == b"f"
    write_file(tmp_path, "dangling", WS, b"n")  # writing through a link creates its (inside) target
    assert (tmp_path / "real/new").read_bytes() == b"n"


def test_special_files_and_loops_are_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")  # opening it to read would block forever without O_NONBLOCK
    os.symlink("loop", tmp_path / "loop")
    (tmp_path / "d").mkdir()
    (tmp_path / "f").write_text("f")
    for name, words in (("fifo", "regular"), ("loop", "symbolic"), ("d", "regular"), ("", "directory")):
        with pytest.raises(SandboxError, match=words):
            read_file(tmp_path, name, WS)
    with pytest.raises(SandboxError, match="not a directory"):
        read_file(tmp_path, "f/x", WS)
    with pytest.raises(SandboxError, match="no such file"):
        read_file(tmp_path, "missing", WS)


def test_owner_is_given_to_created_files_and_directories(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    write_file(tmp_path, "x/y/z.txt", WS, b"z", owner=123456)
    for p in (tmp_path / "x", tmp_path / "x/y", tmp_path / "x/y/z.txt"):
        assert p.stat().st_uid == 123456 and p.stat().st_gid == 123456
