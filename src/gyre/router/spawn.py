"""Start ``gyre router`` as a child process (tests, examples, the driver's out-of-process mode)."""

from __future__ import annotations

import sys
from pathlib import Path

from gyre.engine.launcher import ServerProcess, free_port


def launch_router(
    model_path: str | Path,
    engines: list[str],
    journal_dir: str | Path | None = None,
    overrides: list[str] | None = None,
    log_path: Path | None = None,
    timeout_s: float = 60.0,
    open_files: int | None = None,
) -> tuple[ServerProcess, str]:
    """Start a router on free ports; returns the process (agent-facing URL) and the admin URL.

    ``open_files`` lowers its descriptor limit (RLIMIT_NOFILE), to try it at that limit."""
    port, admin_port = free_port(), free_port()
    args = [sys.executable, "-m", "gyre", "router", "--model", str(model_path), "--port", str(port)]
    args += ["--admin-port", str(admin_port), "--engines", ",".join(engines)]
    if journal_dir is not None:
        args += ["--journal", str(journal_dir)]
    for item in overrides or []:
        args += ["--set", item]
    if open_files is not None:
        args = ["bash", "-c", 'ulimit -n "$0" && exec "$@"', str(open_files), *args]
    proc = ServerProcess(args, port, log_path).wait_ready(timeout_s)
    return proc, f"http://127.0.0.1:{admin_port}"
