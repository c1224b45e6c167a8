"""Start inference engine servers as child processes and wait until they serve.

``embedded``: ``gyre serve-engine`` (CPU or GPU). ``sglang``: ``python -m sglang.launch_server`` with the memory
saver enabled so release/resume work (needs ``pip install gyre[gpu]`` and a GPU).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from gyre.control.forkserver import Process, spawn
from gyre.errors import EngineUnavailable
from gyre.protocol import format_weight_version


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on at ``host`` right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """A running engine server; ``stop()`` (or leaving the ``with`` block) terminates it."""

    def __init__(
        self,
        args: list[str],
        port: int,
        log_path: Path | None,
        env: dict[str, str] | None = None,
        die_with_parent: bool = False,
        host: str = "127.0.0.1",
    ) -> None:
        self.port = port
        self.url = f"http://{host}:{port}"  # where it listens; other machines reach it here when host is not loopback
        self.log_path = log_path
        out = open(log_path, "ab") if log_path else None  # noqa: SIM115 - the child keeps its own descriptor
        try:
            self.proc: Process = spawn(
                args,
                stdout=out or subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                die_with_parent=die_with_parent,
            )
        finally:
            if out is not None:
                out.close()

    def wait_ready(self, timeout_s: float) -> ServerProcess:
        """Block until ``/health`` answers 200; raise EngineUnavailable if the process dies or time runs out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EngineUnavailable(
                    f"engine exited with code {self.proc.returncode} before serving{self._tail()}"
                )
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise EngineUnavailable(f"engine did not serve within {timeout_s:.0f} s{self._tail()}")

    def _tail(self) -> str:
        if self.log_path and self.log_path.exists():
            return "; its log ends with:\n" + self.log_path.read_text(errors="replace")[-2000:]
        return ""

    def kill(self) -> None:
        """Kill the process at once (as a crash would)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Terminate gracefully, then kill."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def launch_embedded(
    model_path: str | Path,
    port: int | None = None,
    overrides: list[str] | None = None,
    log_path: Path | None = None,
    timeout_s: float = 120.0,
    die_with_parent: bool = False,
    host: str = "127.0.0.1",
) -> ServerProcess:
    """Start ``gyre serve-engine`` on ``model_path`` at ``host`` (an address of this machine) and wait for it to
    serve.

    Without ``port`` a free one is chosen; if another process takes it before the engine binds (the port was free
    when asked, not when used), the engine is started again on another one. ``die_with_parent`` (Linux): the engine
    is killed when the calling thread ends, so a killed cell leaves no engine behind; call it from a thread that
    lives as long as the engine should.
    """
    for attempt in range(3):
        chosen = port or free_port(host)
        args = [
            sys.executable,
            "-m",
            "gyre",
            "serve-engine",
            "--model",
            str(model_path),
            "--port",
            str(chosen),
        ]
        for item in [*(overrides or []), f"engine.host={json.dumps(host)}"]:
            args += ["--set", item]
        try:
            return ServerProcess(
                args, chosen, log_path, die_with_parent=die_with_parent, host=host
            ).wait_ready(timeout_s)
        except EngineUnavailable as exc:
            if port is not None or attempt == 2 or "address already in use" not in str(exc):
                raise
    raise AssertionError("unreachable")


def sglang_command(
    model_path: str | Path,
    port: int,
    tp_size: int = 1,
    mem_fraction_static: float = 0.8,
    weight_version: int = 0,
    extra_args: list[str] | None = None,
    host: str = "127.0.0.1",
) -> list[str]:
    """The command line of an SGLang server: memory saver on, weights numbered ``weight_version`` (not SGLang's
    ``"default"``, which Gyre refuses to record)."""
    return [
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", str(model_path),
        "--host", host,
        "--port", str(port),
        "--tp-size", str(tp_size),
        "--mem-fraction-static", str(mem_fraction_static),
        "--enable-memory-saver",
        "--weight-version", format_weight_version(weight_version),
        *(extra_args or []),
    ]  # fmt: skip


def launch_sglang(
    model_path: str | Path,
    port: int | None = None,
    tp_size: int = 1,
    mem_fraction_static: float = 0.8,
    extra_args: list[str] | None = None,
    log_path: Path | None = None,
    timeout_s: float = 900.0,
    weight_version: int = 0,
    die_with_parent: bool = False,
    host: str = "127.0.0.1",
) -> ServerProcess:
    """Start a real SGLang server (see `sglang_command`) at ``host`` and wait for it to serve."""
    try:
        import sglang  # noqa: F401
    except ImportError:
        raise EngineUnavailable("the sglang backend needs the gpu extra: pip install 'gyre[gpu]'") from None
    port = port or free_port(host)
    args = sglang_command(model_path, port, tp_size, mem_fraction_static, weight_version, extra_args, host)
    return ServerProcess(args, port, log_path, die_with_parent=die_with_parent, host=host).wait_ready(
        timeout_s
    )
