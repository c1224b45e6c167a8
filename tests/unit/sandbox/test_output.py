"""gyre.sandbox.process and limits: output capping, the truncation marker, exit decoding, which limit was hit."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from gyre.sandbox.limits import classify, join_argv
from gyre.sandbox.process import Capture, cut_utf8, exit_status, truncation_marker


def test_capture_keeps_the_limit_and_counts_everything() -> None:
    cap = Capture(10)
    for chunk in (b"12345", b"67890", b"abcdef"):
        cap.feed(chunk)
    assert bytes(cap.data) == b"1234567890" and cap.total == 16 and cap.truncated
    assert cap.text() == "1234567890" + truncation_marker(10, 16)
    assert cap.text().endswith("\n[gyre: output truncated after 10 bytes; 16 bytes in all]")


def test_capture_at_exactly_the_limit_is_not_truncated() -> None:
    cap = Capture(4)
    cap.feed(b"abcd")
    assert not cap.truncated and cap.text() == "abcd"


def test_binary_output_decodes_with_replacement_characters() -> None:
    cap = Capture(100)
    cap.feed(b"ok \xff\xfe\x00 end")
    assert cap.text() == "ok \ufffd\ufffd\x00 end"


def test_a_cut_through_a_multibyte_character_drops_the_fragment() -> None:
    data = "abcé€".encode()  # é is 2 bytes, € is 3
    for limit, kept in ((4, "abc"), (5, "abcé"), (6, "abcé"), (7, "abcé"), (8, "abcé€")):
        cap = Capture(limit)
        cap.feed(data + b"!")
        assert cap.text() == kept + truncation_marker(limit, len(data) + 1)


@given(st.text(max_size=50), st.integers(min_value=0, max_value=60))
def test_cut_utf8_leaves_a_valid_prefix(text: str, n: int) -> None:
    data = text.encode()[:n]
    cut = cut_utf8(data)
    assert data.startswith(cut) and len(data) - len(cut) <= 3
    cut.decode()  # no exception: whole characters only
    assert text.encode().startswith(cut)


def test_exit_status_follows_the_shell_convention() -> None:
    assert exit_status(0) == (0, None)
    assert exit_status(3) == (3, None)
    assert exit_status(-9) == (137, "SIGKILL")  # the launcher itself killed
    assert exit_status(137) == (137, "SIGKILL")  # a child killed, reported by bwrap or a shell
    assert exit_status(128 + signal.SIGXCPU) == (152, "SIGXCPU")
    assert exit_status(128) == (128, None)


def test_classify_prefers_kernel_counters_then_signals_then_messages() -> None:
    assert classify(137, "SIGKILL", "", oom_kills=1, refused_forks=0) == "memory"
    assert classify(1, None, "fork: retry", oom_kills=0, refused_forks=3) == "processes"
    assert classify(152, "SIGXCPU", "", 0, 0) == "cpu_time"
    assert classify(153, "SIGXFSZ", "", 0, 0) == "file_size"
    assert classify(1, None, "Traceback...\nMemoryError\n", 0, 0) == "memory"
    assert classify(1, None, "OSError: [Errno 24] Too many open files", 0, 0) == "open_files"
    assert classify(1, None, "OSError: [Errno 27] File too large", 0, 0) == "file_size"
    assert classify(254, None, "bash: fork: retry: Resource temporarily unavailable", 0, 0) == "processes"
    assert classify(0, None, "MemoryError", 0, 0) is None  # a command that succeeded only printed the words
    assert classify(0, None, "bash: fork: retry: Resource temporarily unavailable", 0, 0) == "processes"
    assert classify(1, None, "plain failure", 0, 0) is None


def test_join_argv_quotes_paths_and_execs_its_arguments() -> None:
    argv = join_argv(["/sys/fs/cgroup/pids/a b/cgroup.procs"])
    # --norc: a bash whose stdin is a socket (a command server's) would read ~/.bashrc otherwise
    assert argv[0].endswith("/bash") and argv[1:4] == ["--norc", "--noprofile", "-c"] and argv[-1] == "bash"
    assert "'/sys/fs/cgroup/pids/a b/cgroup.procs'" in argv[4] and argv[4].endswith('exec "$@"')
    assert join_argv([], "/x y/f.bpf")[4].endswith("exec \"$@\" 3<'/x y/f.bpf'")


def test_the_launcher_closes_every_descriptor_above_stderr(tmp_path: Path) -> None:
    extra = [os.open(tmp_path, os.O_RDONLY) for _ in range(12)]  # up to two-digit numbers
    (tmp_path / "fd3").write_text("for the backend")
    try:
        out = subprocess.run(
            [*join_argv([], str(tmp_path / "fd3")), "sh", "-c", "ls /proc/$$/fd; cat <&3"],
            pass_fds=extra,
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        for fd in extra:
            os.close(fd)
    assert out.stdout.split() == ["0", "1", "2", "3", "for", "the", "backend"], out


def test_the_launcher_binds_staged_paths_in_a_mount_namespace_of_its_own() -> None:
    argv = join_argv([], None, [("/root/a b", "/tmp/stage/0")])
    assert argv[0].endswith("/unshare") and argv[1:5] == ["--mount", "--propagation", "private", "--"]
    assert "--rbind -- '/root/a b' /tmp/stage/0 ||" in argv[9]
    assert join_argv([])[0].endswith("/bash")  # nothing to bind: no namespace
