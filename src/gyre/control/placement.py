"""Where a run's processes start: on this machine (`LocalLauncher`, the default) or where Ray places them
(`RayLauncher`, ``gyre train --ray``).

Both start the same commands, ``gyre cell`` and ``gyre shard``, and hand back a `Process` the driver polls and kills
like a local ``subprocess.Popen``. Ray only places and supervises: each process is the child of a small Ray actor
(`_Supervisor`) holding its resources, the cells in one placement group (the core's bundle first) on accelerator nodes
and the shards in another on CPU nodes; tokens, weights and control messages still go over ZeroMQ, HTTP and
torch.distributed. A process dies with its actor (and its node); the driver sees it exit as it sees a local one die.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import msgspec

from gyre.config import GyreConfig
from gyre.control.forkserver import exit_with_parent, spawn
from gyre.errors import ConfigError
from gyre.journal import Journal

log = logging.getLogger(__name__)
RAY_INSTALL = "pip install 'gyre[ray]' (or pip install 'ray>=2.9')"


class Process(Protocol):
    """What the driver needs of a started process (``subprocess.Popen`` has it)."""

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...

    def send_signal(self, sig: int) -> None: ...


class Launcher(Protocol):
    def start_cell(self, index: int, argv: list[str], log: Path) -> Process: ...

    def start_shard(self, name: str, hub: str, config: Path, log: Path) -> Process: ...

    def close(self) -> None: ...


def shard_command(name: str, hub: str, config: Path) -> list[str]:
    """``gyre shard``'s command line."""
    return [
        sys.executable,
        "-m",
        "gyre",
        "-v",
        "shard",
        "--hub",
        hub,
        "--name",
        name,
        "--config",
        str(config),
    ]


def _popen(argv: list[str], log: Path) -> Process:
    with open(log, "ab") as out:
        return spawn(argv, stdout=out, stderr=subprocess.STDOUT, die_with_parent=True)


class LocalLauncher:
    """Processes on this machine, dying with the driver's thread that started them."""

    def start_cell(self, index: int, argv: list[str], log: Path) -> Process:
        return _popen(argv, log)

    def start_shard(self, name: str, hub: str, config: Path, log: Path) -> Process:
        return _popen(shard_command(name, hub, config), log)

    def close(self) -> None:
        pass


def import_ray() -> Any:
    """Ray, or a `ConfigError` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError(f"--ray needs Ray, which is not installed: {RAY_INSTALL}") from None
    return ray


def ray_address() -> str:
    """This (the driver's) node's address as Ray's other nodes reach it."""
    return str(import_ray().util.get_node_ip_address())


class _Supervisor:
    """(A Ray actor) starts one process on its node with the actor's resources, and reports its end."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, argv: list[str], log: str, host_flag: bool) -> dict[str, str]:
        import ray

        node_ip = ray.util.get_node_ip_address()
        model = [Path(argv[i + 1]) for i, a in enumerate(argv[:-1]) if a == "--model"]
        for path in (Path(log).parent, *(Path(a) for a in argv if a.endswith(".toml")), *model):
            if not path.exists():
                raise FileNotFoundError(f"{path} is not on node {node_ip}: with --ray the run directory and the model "
                                        "must be on storage every node shares, at the same path")  # fmt: skip
        if host_flag:  # the cell's engine and trainer listen on this node's address
            argv = [*argv, "--host", node_ip]
        env = {**os.environ, "GYRE_RAY_NODE": ray.get_runtime_context().get_node_id()}
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                         preexec_fn=exit_with_parent)  # fmt: skip
        return {"node": env["GYRE_RAY_NODE"], "ip": node_ip, "pid": str(self.proc.pid)}

    def wait(self) -> int:
        assert self.proc is not None
        return self.proc.wait()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()


class RayProcess:
    """A process a `_Supervisor` actor starts (``started``: its answer, once the actor is placed). A thread waits for
    the start, then for the end (the process's, or its actor's, or its node's): nothing here blocks the driver."""

    def __init__(
        self, ray: Any, actor: Any, started: Any, name: str, placed: Callable[[dict[str, str]], None]
    ) -> None:
        self.ray, self.actor, self.name = ray, actor, name
        self.where: dict[str, str] = {}
        self._code: int | None = None
        self._ended = threading.Event()
        threading.Thread(
            target=self._watch, args=(started, placed), name=f"ray-watch-{name}", daemon=True
        ).start()

    def _watch(self, started: Any, placed: Callable[[dict[str, str]], None]) -> None:
        try:
            self.where = self.ray.get(started)
        except Exception as exc:  # it could not start there
            log.error("%s could not start on its node: %s", self.name, str(exc).strip().splitlines()[-1])
            self._code = -signal.SIGKILL
            self._ended.set()
            return
        placed(self.where)
        try:
            code = int(self.ray.get(self.actor.wait.remote()))
        except Exception as exc:  # the actor died (its node with it): like a process killed
            log.warning("%s: its Ray actor is gone (%s)", self.name, type(exc).__name__)
            code = -signal.SIGKILL
        self._code = code
        self._ended.set()

    @property
    def returncode(self) -> int | None:
        return self._code

    def poll(self) -> int | None:
        return self._code

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.name, timeout or 0.0)
        assert self._code is not None
        return self._code

    def kill(self) -> None:
        self.ray.kill(self.actor)  # the process dies with its actor (exit_with_parent)

    def send_signal(self, sig: int) -> None:
        self.kill()


class Placement(msgspec.Struct, frozen=True, kw_only=True):
    """One line of ``journal/placement.jsonl``: where Ray started a process."""

    at_s: float
    process: str  # cell-0, shard-1 ...
    node: str  # Ray's node id
    ip: str
    pid: int
    bundle: dict[str, float]


class RayLauncher:
    """Cells and shards placed by Ray on the cluster at ``address`` (``auto``: the one this machine belongs to);
    where each process went is journaled in ``journal_dir/placement.jsonl``. Creating it waits (blocking) until the
    cluster holds both placement groups."""

    def __init__(self, cfg: GyreConfig, address: str = "auto", journal_dir: str | Path | None = None,
                 cells: int | None = None) -> None:  # fmt: skip
        """``cells``: how many cells to place (default: ``[cells]``'s count and standalone servers; 0: shards only,
        as ``gyre eval --ray`` runs)."""
        self.ray = ray = import_ray()
        from ray.util.placement_group import placement_group

        if not ray.is_initialized():
            ray.init(address=address or "auto", log_to_driver=False, logging_level=logging.WARNING)
        self.cfg = cfg
        rc = cfg.ray
        self.cell_bundle = {"CPU": rc.cell_cpus, **({"GPU": rc.cell_gpus} if rc.cell_gpus else {}),
                            **rc.cell_resources}  # fmt: skip
        self.shard_bundle = {"CPU": rc.shard_cpus, **rc.shard_resources}
        self.procs: list[RayProcess] = []
        self.journal = Journal(journal_dir, "placement.jsonl") if journal_dir else None
        cells = cfg.cells.count + cfg.cells.standalone if cells is None else cells
        self.cells = placement_group([dict(self.cell_bundle) for _ in range(cells)],
                                     strategy=rc.cell_strategy) if cells else None  # fmt: skip
        self.shards = placement_group([dict(self.shard_bundle) for _ in range(cfg.shards.count)],
                                      strategy=rc.shard_strategy) if cfg.shards.count else None  # fmt: skip
        for what, group, bundle, n, strategy in (
            ("cell", self.cells, self.cell_bundle, cells, rc.cell_strategy),
            ("shard", self.shards, self.shard_bundle, cfg.shards.count, rc.shard_strategy),
        ):
            if group is None:
                continue
            try:
                ray.get(group.ready(), timeout=rc.placement_timeout_s)
            except Exception as exc:
                self.close()
                raise ConfigError(
                    f"Ray could not place {n} {what}s ({bundle} each, {strategy}) within "
                    f"{rc.placement_timeout_s:g} s; the cluster has {ray.cluster_resources()} "
                    f"({type(exc).__name__}). Set [ray] {what}_cpus, {what}_gpus, {what}_resources to what its "
                    "nodes offer"
                ) from None
        self.actor = ray.remote(_Supervisor)

    def _start(self, group: Any, index: int, bundle: dict[str, float], argv: list[str], log_path: Path,
               host_flag: bool, name: str) -> RayProcess:  # fmt: skip
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        custom = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}
        actor = self.actor.options(
            num_cpus=bundle.get("CPU", 0), num_gpus=bundle.get("GPU", 0), resources=custom or None,
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index),
        ).remote()  # fmt: skip

        def placed(where: dict[str, str]) -> None:
            log.info(
                "%s placed by Ray on node %s (%s), pid %s",
                name,
                where["node"][:12],
                where["ip"],
                where["pid"],
            )
            if self.journal is not None:
                self.journal.append(Placement(at_s=time.time(), process=name, node=where["node"], ip=where["ip"],
                                              pid=int(where["pid"]), bundle=bundle))  # fmt: skip

        proc = RayProcess(self.ray, actor, actor.start.remote(argv, str(log_path), host_flag), name, placed)
        self.procs.append(proc)
        return proc

    def start_cell(self, index: int, argv: list[str], log: Path) -> Process:
        assert self.cells is not None
        return self._start(self.cells, index, self.cell_bundle, argv, log, True, Path(log).stem)

    def start_shard(self, name: str, hub: str, config: Path, log: Path) -> Process:
        assert self.shards is not None
        index = int(name.rsplit("-", 1)[-1])
        return self._start(
            self.shards, index, self.shard_bundle, shard_command(name, hub, config), log, False, name
        )

    def close(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for proc in self.procs:
            if proc.poll() is None:
                try:
                    proc.kill()
                except Exception as exc:
                    log.debug("killing %s: %s", proc.name, exc)
        for group in (getattr(self, "cells", None), getattr(self, "shards", None)):
            if group is not None:
                try:
                    remove_placement_group(group)
                except Exception as exc:
                    log.debug("removing a placement group: %s", exc)
        if self.journal is not None:
            self.journal.close()


def ray_config(cfg: GyreConfig) -> GyreConfig:
    """``cfg`` for a run Ray places: at least one shard, and the control plane bound where other nodes reach it."""
    host = ray_address()

    def routable(bind: str) -> str:
        return bind.replace("127.0.0.1", host).replace("localhost", host)

    return msgspec.structs.replace(
        cfg,
        shards=msgspec.structs.replace(
            cfg.shards, count=cfg.shards.count or 1, bind=routable(cfg.shards.bind)
        ),
        controller=msgspec.structs.replace(cfg.controller, bind=routable(cfg.controller.bind)),
    )
