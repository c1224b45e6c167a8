"""Finding host processes by command line, to prove a sandbox left none behind or see what they run as."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path


def processes_with(marker: str) -> list[int]:
    """Pids of host processes whose command line contains ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if marker in cmdline:
                found.append(int(entry))
    return found


def wait_process(cmdline: str, timeout_s: float = 60.0) -> int:
    """The pid of the host process whose command line is exactly ``cmdline``, once it exists (polls /proc: a
    process started in a sandbox signals nothing to the host; a loaded machine can take seconds to start one)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for pid in processes_with(cmdline):
            with contextlib.suppress(OSError):
                if (
                    Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
                    == cmdline.encode().split()
                ):
                    return pid
        time.sleep(0.02)
    raise AssertionError(f"no process {cmdline!r} within {timeout_s} s")


def status(pid: int) -> dict[str, str]:
    """The fields of ``/proc/<pid>/status``."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}
