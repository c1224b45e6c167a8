"""``gyre sandbox run`` as a user runs it to check their set-up and see what is blocked."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

GYRE = [sys.executable, "-m", "gyre", "sandbox", "run"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GYRE, *args], capture_output=True, text=True, timeout=60)


def test_a_command_prints_its_result_and_the_set_up(bwrap_available: None) -> None:
    out = _run("--", "echo", "hello")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("exit code: 0 (") and "flags: none" in out.stdout
    assert "--- stdout ---\nhello\n--- stderr ---\n" in out.stdout
    assert (
        "sandbox: bubblewrap (isolated, no network; a command server per sandbox)" in out.stderr
        and "processes" in out.stderr
    )


def test_what_is_blocked_shows_as_failures(bwrap_available: None) -> None:
    net = _run(
        "--", "cat /proc/net/dev /proc/net/route"
    )  # what the sandbox sees: no interface but lo, no route
    interfaces = re.findall(r"^\s*(\S+):\s+\d", net.stdout, re.MULTILINE)
    assert net.returncode == 0 and interfaces == ["lo"] and "Iface" in net.stdout, net.stdout
    routes = net.stdout.split("Iface", 1)[1].split("--- stderr ---")[0].splitlines()[1:]
    assert [r for r in routes if r.strip()] == [], net.stdout  # the routing table's header alone
    home = _run("--", "ls", "/root")
    assert home.returncode == 2 and "cannot access '/root'" in home.stdout
    slow = _run("--timeout", "0.5", "--", "sleep 10")
    assert slow.returncode == 124 and "flags: timed out, killed by SIGKILL" in slow.stdout


def test_workspace_and_backend_options(scratch: Path, bwrap_available: None) -> None:
    tmp_path = scratch  # a root driver's sandbox runs as its own uid: the workspace is reachable by others
    (tmp_path / "notes.txt").write_text("my notes")
    out = _run("--workspace", str(tmp_path), "--", "cat notes.txt; pwd; echo new > made.txt")
    assert out.returncode == 0 and "my notes/workspace\n" in out.stdout
    assert (tmp_path / "made.txt").read_text() == "new\n" and (tmp_path / "notes.txt").exists()
    local = _run("--backend", "local", "--workspace", str(tmp_path), "--", "pwd")
    assert local.returncode == 0 and f"{tmp_path}\n" in local.stdout
    assert "NOT isolated" in local.stderr and "WITHOUT isolation" in local.stderr


def test_usage_errors_are_one_clear_line() -> None:
    none = _run()
    assert none.returncode == 2 and "give the command after --" in none.stderr
    bad = _run("--set", "sandbox.memory_mib=-1", "--", "true")
    assert bad.returncode == 2 and "memory_mib" in bad.stderr and "Traceback" not in bad.stderr
