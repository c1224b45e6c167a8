"""Local cells, their controller and the router in front of them: what a driver on one machine starts.

``async with Cluster(cfg, model_path, run_dir) as cluster``: the controller binds, the router's pool is empty, the
cells ``[cells]`` asks for are started as ``gyre cell`` processes (resolved config in ``run_dir/config.toml``, logs
in ``run_dir/logs/``), and the body runs once every one of them serves the core's weights. Leaving it tells the cells
to stop and waits for them. Cells on other machines join the same controller by address (``gyre cell --controller``).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from pathlib import Path

import msgspec

from gyre.config import GyreConfig, dump_config
from gyre.control.cellprocess import CellSpec, cell_command, cell_specs
from gyre.control.controller import ControlledPool, Controller
from gyre.control.placement import Launcher, LocalLauncher, Process
from gyre.errors import CellError
from gyre.router.pool import EnginePool
from gyre.router.routing import Router

SHUTDOWN_S = 30.0  # how long cells may take to stop once told; then they are killed (a gone one at once)


class Cluster:
    """The cells of one run on this machine, with the controller and router that use them."""

    def __init__(self, cfg: GyreConfig, model_path: str | Path, run_dir: str | Path,
                 launcher: Launcher | None = None, pool: ControlledPool | None = None) -> None:  # fmt: skip
        """``launcher``: where cells start (default: this machine); ``pool``: the engines the controller routes to
        (default: the router's here; runtime shards: every shard's, `gyre.runtime.shards.ShardedPool`, and no
        router here)."""
        self.cfg, self.model_path, self.run_dir = cfg, str(model_path), Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.launcher = launcher or LocalLauncher()
        router_cfg = cfg.router
        if not router_cfg.model_path:
            router_cfg = msgspec.structs.replace(router_cfg, model_path=self.model_path)
        self.router: Router | None = None
        if pool is None:
            self.pool = EnginePool.from_config(router_cfg)
            self.router = Router(router_cfg, pool=self.pool)
            pool = self.pool
        self.controller = Controller(cfg.controller, pool, self.run_dir, chaos=cfg.chaos)
        self.procs: dict[str, Process] = {}
        self.specs: dict[str, CellSpec] = {}

    async def __aenter__(self) -> Cluster:
        await self.controller.__aenter__()
        try:
            (self.run_dir / "config.toml").write_text(dump_config(self.cfg))
            (self.run_dir / "logs").mkdir(exist_ok=True)
            for spec in cell_specs(
                self.cfg, self.controller.address, self.model_path, str(self.run_dir / "logs")
            ):
                self.start(spec)
            await self.wait_started(list(self.specs))
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        self._watching = asyncio.ensure_future(self._watch())  # cancelled in __aexit__
        return self

    async def _watch(self) -> None:
        """A cell whose process exited is gone at once (its silence would take ``cell_timeout_s`` to tell)."""
        while True:
            await asyncio.sleep(self.cfg.controller.heartbeat_s)
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    self.controller.process_exited(name, proc.returncode)

    def start(self, spec: CellSpec) -> None:
        """Start (or restart) one cell process."""
        self.specs[spec.name] = spec
        log = self.run_dir / "logs" / f"{spec.name}.log"
        self.procs[spec.name] = self.launcher.start_cell(spec.order, cell_command(spec, self.run_dir / "config.toml"),
                                                         log)  # fmt: skip

    async def wait_started(self, names: list[str]) -> None:
        """Return once the cells ``names`` serve; a cell process that exits first is an error naming its log."""
        async with asyncio.timeout(self.cfg.cells.startup_timeout_s):
            for name in names:
                while True:
                    if self.procs[name].poll() is not None:
                        log = self.run_dir / "logs" / f"{name}.log"
                        raise CellError(f"cell {name} exited with code {self.procs[name].returncode} before "
                                        f"serving; see {log}")  # fmt: skip
                    try:
                        await self.controller.wait_role(name, ("serving",), 0.5)
                        break
                    except TimeoutError:
                        continue

    def kill(self, name: str) -> None:
        """SIGKILL a cell process (its engine dies with it)."""
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait()

    async def __aexit__(self, *exc: object) -> None:
        if (watching := getattr(self, "_watching", None)) is not None:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
        deadline, told = time.monotonic() + SHUTDOWN_S, 0.0
        # a cell declared gone (silent) would not hear CellShutdown: it is killed without waiting
        gone = {c.name for c in self.controller.cells.values() if c.role == "gone"}
        while time.monotonic() < deadline and any(
            p.poll() is None and name not in gone for name, p in self.procs.items()
        ):
            gone = {c.name for c in self.controller.cells.values() if c.role == "gone"}
            if time.monotonic() - told >= 1.0:  # again each second: the message may be lost on the way
                told = time.monotonic()
                with contextlib.suppress(Exception):
                    await self.controller.shutdown_cells()
            await asyncio.sleep(0.05)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                await asyncio.to_thread(proc.wait)
        await self.controller.__aexit__(None, None, None)
        if self.router is not None:
            await self.router.aclose()
