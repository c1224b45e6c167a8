"""A deployment as it spans machines, on one: the driver (controller, router, trainer client) in this process, each
cell and a satellite trainer a ``gyre`` process started by hand with explicit ``tcp://127.0.0.1:PORT`` addresses.
Nothing is shared but TCP: no ipc://, no in-process objects, no path handed from the driver to a cell."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import msgspec
import openai
import pytest
import uvicorn

from gyre.config import dump_config, load_config
from gyre.control.controller import Controller
from gyre.engine.launcher import free_port
from gyre.router.app import build_agent_app
from gyre.router.pool import EnginePool
from gyre.router.routing import Router
from reference import random_micro_steps
from robust import ROBUST

pytestmark = pytest.mark.slow(reason="cells and a satellite started by hand join over TCP")
BASE = [
    "cells.engine_overrides=['engine.kv_cache_mem_gib=0.1']", "cells.num_threads=1", "cells.host=\"127.0.0.1\"",
    "trainer.learning_rate=1e-3", "trainer.heartbeat_s=0.25", "trainer.transfer_timeout_s=30",
    "controller.heartbeat_s=0.25",
    *ROBUST,  # every cell and the satellite are healthy: none is judged silent on a loaded machine
]  # fmt: skip


def _gyre(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "gyre", "-v", *args], stdout=out, stderr=subprocess.STDOUT
        )


async def _chat(base_url: str, router: Router, model: str) -> list[int]:
    """One call through the router's HTTP API with the official client; the weight versions of its tokens."""
    token = router.open_session("tcp-check")
    async with openai.AsyncOpenAI(
        base_url=f"{base_url}/s/{token}/v1", api_key="unused", max_retries=0
    ) as client:
        r = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hello"}],
                                                 max_tokens=8, temperature=1.0)  # fmt: skip
    assert r.choices[0].message.content is not None
    (record,) = router.records(token)
    return record.token_versions()


def test_cells_and_a_satellite_join_by_address_over_tcp(tiny_model: Path, tmp_path: Path) -> None:
    cfg = load_config(None, [*BASE, f'controller.bind="tcp://127.0.0.1:{free_port()}"'])
    config = tmp_path / "cell.toml"  # each machine's own copy of the run's configuration
    config.write_text(dump_config(cfg))
    procs: list[subprocess.Popen[bytes]] = []

    async def main() -> dict[str, object]:
        pool = EnginePool(60.0, 8, 600.0)
        router = Router(msgspec.structs.replace(cfg.router, model_path=str(tiny_model)), pool=pool)
        seen: dict[str, object] = {}
        async with Controller(cfg.controller, pool, tmp_path / "run") as controller:
            assert controller.address == cfg.controller.bind  # the address cells were told, not a chosen one
            for name, kind, order in (("cell-0", "core", 0), ("cell-1", "satellite", 1)):
                procs.append(_gyre(["cell", "--controller", controller.address, "--name", name, "--kind", kind,
                                    "--order", str(order), "--model", str(tiny_model), "--host", "127.0.0.1",
                                    "--config", str(config)], tmp_path / f"{name}.log"))  # fmt: skip
            await controller.wait_serving(2, 180)
            port = free_port()
            server = uvicorn.Server(uvicorn.Config(build_agent_app(router), host="127.0.0.1", port=port,
                                                   log_level="warning"))  # fmt: skip
            async with asyncio.TaskGroup() as tasks:
                serving = tasks.create_task(server.serve())
                while not server.started:
                    assert not serving.done(), "the router's HTTP server did not start"
                    await asyncio.sleep(0.05)
                base_url = f"http://127.0.0.1:{port}"
                seen["engines"] = sorted(e.url for e in pool.engines.values())
                seen["core"] = controller.core_address
                seen["before"] = await _chat(base_url, router, tiny_model.name)

                from gyre.train.trainerclient import TrainerClient

                trainer = TrainerClient(controller.core_address, timeout_s=120)
                try:
                    # step 0: only a satellite trainer started by hand computes (the core cell serves, so its
                    # own worker does not)
                    sat = _gyre(["trainer", "satellite", "--core", controller.core_address, "--name", "sat-a",
                                 "--threads", "1"], tmp_path / "sat-a.log")  # fmt: skip
                    procs.append(sat)
                    while (await asyncio.to_thread(trainer.statistics)).members.get("sat-a") != "active":
                        assert sat.poll() is None, (tmp_path / "sat-a.log").read_text()[-2000:]
                        await asyncio.sleep(0.1)
                    await asyncio.to_thread(trainer.submit, 0, random_micro_steps(1, 4), True)
                    step0 = await asyncio.to_thread(trainer.wait_step, 0, 300)
                    sat.send_signal(signal.SIGTERM)  # leaves after its micro-step
                    await asyncio.to_thread(sat.wait, 60)
                    # step 1: cell-1 switches to training, joins the core's step over its TCP pair group, and back
                    to_train = await controller.to_train("cell-1")
                    await asyncio.to_thread(trainer.submit, 1, random_micro_steps(2, 4), True)
                    step1 = await asyncio.to_thread(trainer.wait_step, 1, 300)
                    to_serve = await controller.to_serve("cell-1")
                finally:
                    trainer.close()
                seen["by_member"] = (step0.by_member, step1.by_member)
                seen["switches"] = (to_train.direction, to_serve.direction, to_serve.version)
                seen["sat_exit"] = sat.returncode
                # every engine now serves version 2 (pushed over the network after each update)
                seen["after"] = [await _chat(base_url, router, tiny_model.name) for _ in range(4)]
                server.should_exit = True
            for _ in range(40):
                await controller.shutdown_cells()
                if all(p.poll() is not None for p in procs):
                    break
                await asyncio.sleep(0.25)
        await router.aclose()
        return seen

    try:
        seen = asyncio.run(main())
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    assert all(url.startswith("http://127.0.0.1:") for url in seen["engines"])  # type: ignore[attr-defined]
    assert len(seen["engines"]) == 2  # type: ignore[arg-type]
    assert str(seen["core"]).startswith("tcp://127.0.0.1:")
    assert set(seen["before"]) == {0}  # type: ignore[arg-type]
    step0, step1 = seen["by_member"]  # type: ignore[misc]
    assert step0 == {"sat-a": 4}
    assert step1 == {"cell-1": 4}
    assert seen["switches"] == ("serve_to_train", "train_to_serve", 2)
    assert seen["sat_exit"] == 0
    assert all(set(versions) == {2} for versions in seen["after"])  # type: ignore[attr-defined]
