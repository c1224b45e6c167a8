"""Elastic data parallelism across processes: satellites joining a step under way, leaving, dying or going silent
mid-micro-step; the update always equals one process computing the whole batch (weights and optimizer state)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import msgspec
import pytest
import torch
import zmq
from safetensors.torch import load_file

from gyre.config import ChaosConfig, LossConfig, TrainerConfig
from gyre.engine.launcher import free_port
from gyre.errors import TrainerError
from gyre.protocol import MicroStep, StepMetrics, TrainerStatistics
from gyre.train.checkpoint import load_flat_state
from gyre.train.state import TrainState
from gyre.train.trainerclient import TrainerClient, launch_core, launch_satellite
from reference import random_micro_steps, train_step

SLOW = pytest.mark.slow(
    reason="an elastic-training scenario with core and satellite processes; the fast tier runs one"
)
LR = 1e-3


def wait_for(what: str, condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Cluster:
    """A core trainer process, satellites, and a client."""

    def __init__(
        self,
        model: Path,
        tmp: Path,
        core_computes: bool,
        timeout_s: float = 30.0,
        resume: Path | None = None,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.tmp = tmp
        self.address = f"tcp://127.0.0.1:{free_port()}"
        overrides = [f'trainer.model_path="{model}"', f"trainer.learning_rate={LR}", "trainer.num_threads=1",
                     f"trainer.core_computes={str(core_computes).lower()}", "trainer.heartbeat_s=0.25",
                     f"trainer.member_timeout_s={timeout_s}", "trainer.transfer_timeout_s=20",
                     *([f'trainer.resume_from="{resume}"'] if resume else []), *extra]  # fmt: skip
        self.core = launch_core(None, overrides, self.address, log=tmp / "core.log")
        self.client = TrainerClient(self.address)
        self.satellites: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str) -> subprocess.Popen[bytes]:
        self.satellites[name] = launch_satellite(self.address, name, 1, log=self.tmp / f"{name}.log")
        return self.satellites[name]

    def stats(self) -> TrainerStatistics:
        return self.client.statistics()

    def weights_after(self, path: Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        saved = self.client.save_checkpoint(path)
        weights = load_file(str(saved / "model.safetensors"))
        return weights, moments_of(saved, weights)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for proc in self.satellites.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
        with suppress(TrainerError):
            self.client.shutdown()
        self.client.close()
        for proc in [self.core, *self.satellites.values()]:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()  # reaped: a process left running is a ResourceWarning in a later test


@contextmanager
def cluster(model: Path, tmp: Path, core_computes: bool = True, timeout_s: float = 30.0) -> Iterator[Cluster]:
    c = Cluster(model, tmp, core_computes, timeout_s)
    try:
        yield c
    finally:
        c.close()


def reference(
    model: Path, items: list[MicroStep], kl_coef: float = 0.0, clip: float | None = None
) -> TrainState:
    """One process computing the whole batch (``clip``: its ``grad_clip_norm``, else the default)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = TrainerConfig(model_path=str(model), learning_rate=LR, loss=LossConfig(kl_coef=kl_coef))
        if clip is not None:
            cfg = msgspec.structs.replace(cfg, grad_clip_norm=clip)
        state = TrainState(cfg)
        train_step(state, items)
        return state
    finally:
        torch.set_num_threads(threads)


def freeze_holding_a_claim(c: Cluster, proc: subprocess.Popen[bytes], name: str) -> None:
    """Stop ``name`` (SIGSTOP) at a moment the core sees it holding a micro-step (messages it sent just before
    stopping have landed: the core's view of a stopped member no longer changes)."""
    for _ in range(100):
        wait_for(f"{name} to hold a micro-step", lambda: name in c.stats().claims, 120)
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(0.3)  # what was on the wire arrives; not a condition the test waits for
        if name in c.stats().claims:
            return
        os.kill(proc.pid, signal.SIGCONT)
    raise AssertionError(f"{name} never stopped while holding a micro-step")


def moments_of(saved: Path, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A checkpoint's AdamW moments per parameter, keyed ``{index}.{key}`` (its ``optimizer/`` holds them flat)."""
    names = json.loads((saved / "trainer_state.json").read_text())["parameters"]
    flat = load_flat_state(saved / "optimizer", sum(weights[n].numel() for n in names))
    out: dict[str, torch.Tensor] = {}
    at = 0
    for i, name in enumerate(names):
        size = weights[name].numel()
        for key in ("exp_avg", "exp_avg_sq"):
            if key in flat:
                out[f"{i}.{key}"] = flat[key][at : at + size].view_as(weights[name])
        at += size
    return out


def assert_same_update(
    got: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]], want: TrainState
) -> None:
    weights, moments = got
    worst = 0.0
    for i, (name, p) in enumerate(want.named):
        worst = max(worst, float((weights[name] - p.detach()).abs().max()))
        for key in ("exp_avg", "exp_avg_sq"):
            worst = max(worst, float((moments[f"{i}.{key}"] - want.optimizer.state[p][key]).abs().max()))
    assert worst <= 1e-6, f"max abs difference {worst:g} from one process computing the whole batch"


def assert_accounted(metrics: StepMetrics, items: list[MicroStep]) -> None:
    assert metrics.micro_steps == len(items)
    assert sum(metrics.by_member.values()) == len(items)  # each micro-step's gradient counted exactly once
    assert metrics.computed_tokens == sum(len(m.input_ids) for m in items)


@pytest.mark.parametrize(
    "seed,satellites,core_computes",
    [(1, 1, True), pytest.param(2, 2, False, marks=SLOW), pytest.param(3, 3, True, marks=SLOW)],
)
def test_satellites_joining_at_random_moments_give_the_update_of_one_process(
    tiny_model: Path, tmp_path: Path, seed: int, satellites: int, core_computes: bool
) -> None:
    rng = random.Random(seed)
    items = random_micro_steps(seed, 60)  # random sizes: random micro-step durations
    with cluster(tiny_model, tmp_path, core_computes) as c:
        c.client.submit(0, items[:8])  # the step is under way before anyone joins
        names = [f"sat{i}" for i in range(satellites)]
        for name in names:
            time.sleep(rng.uniform(0.0, 1.5))
            c.start(name)
        c.client.submit(0, items[8:24])
        wait_for("every satellite to join", lambda: len(c.stats().members) == satellites)

        def taken() -> bool:  # a satellite holds a micro-step or the gradient of one
            stats = c.stats()
            return any(stats.claims.get(n) or stats.held.get(n) for n in names)

        # On a loaded machine the core alone can compute everything queued before a satellite has the step's
        # weights (CI saw {'core': 36}): keep two micro-steps queued until a satellite takes one, then the rest.
        sent, deadline = 24, time.monotonic() + 120
        while not taken() and sent < len(items) - 12:
            assert time.monotonic() < deadline, f"nothing computed for 120 s: {c.stats()}"
            if c.stats().pending < 2:
                c.client.submit(0, items[sent : sent + 1])
                sent += 1
            time.sleep(0.02)
        items = items[: sent + 12]
        c.client.submit(0, items[sent:], seal=True)
        metrics = c.client.wait_step(0, timeout_s=300)
        assert_accounted(metrics, items)
        assert set(metrics.by_member) - {"core"} <= set(names)
        assert any(name in metrics.by_member for name in names), metrics.by_member
        assert metrics.version == 1 and metrics.reclaimed == 0
        got = c.weights_after(tmp_path / "ckpt")
    assert_same_update(got, reference(tiny_model, items))


@SLOW
def test_a_satellite_killed_mid_micro_step_is_replaced_and_nothing_counts_twice(
    tiny_model: Path, tmp_path: Path
) -> None:
    items = random_micro_steps(11, 30)
    # 20 s: the timeout is also the healthy "other"'s, which leaves if the core is silent for twice it
    with cluster(tiny_model, tmp_path, core_computes=False, timeout_s=20.0) as c:
        victim, other = c.start("victim"), c.start("other")
        wait_for("both satellites", lambda: len(c.stats().members) == 2)
        c.client.submit(0, items, seal=True)
        freeze_holding_a_claim(c, victim, "victim")
        victim.kill()
        metrics = c.client.wait_step(0, timeout_s=300)
        assert c.stats().members["victim"] == "gone"
        assert metrics.reclaimed >= 1
        assert_accounted(metrics, items)
        got = c.weights_after(tmp_path / "ckpt")
        assert other.poll() is None  # the survivor stays for the next step
    assert_same_update(got, reference(tiny_model, items))


@pytest.mark.timing
@SLOW
def test_a_silent_satellite_is_declared_gone_and_its_late_gradient_is_not_counted(
    tiny_model: Path, tmp_path: Path
) -> None:
    items = random_micro_steps(12, 30)
    # the sole member is the victim, but it must not be judged silent while it starts and takes a claim
    with cluster(tiny_model, tmp_path, core_computes=True, timeout_s=10.0) as c:
        silent = c.start("silent")
        wait_for("the satellite", lambda: len(c.stats().members) == 1)
        c.client.submit(0, items, seal=True)
        freeze_holding_a_claim(c, silent, "silent")  # it stops answering but keeps its sockets open
        # the only member: with no member heard, its silence is judged against ALL_QUIET timeouts (30 s)
        wait_for(
            "the silent satellite to be declared gone", lambda: c.stats().members["silent"] == "gone", 120
        )
        metrics = c.client.wait_step(0, timeout_s=300)
        assert metrics.reclaimed >= 1
        assert_accounted(metrics, items)
        os.kill(silent.pid, signal.SIGCONT)  # it comes back: whatever it sends now is not counted
        got = c.weights_after(tmp_path / "ckpt")
    assert_same_update(got, reference(tiny_model, items))


@SLOW
def test_a_released_satellite_finishes_its_micro_step_and_leaves(tiny_model: Path, tmp_path: Path) -> None:
    first, second = random_micro_steps(21, 24), random_micro_steps(22, 12)
    with cluster(tiny_model, tmp_path, core_computes=False) as c:
        proc = c.start("a")
        c.start("b")
        wait_for("both satellites", lambda: len(c.stats().members) == 2)
        c.client.submit(0, first, seal=True)
        wait_for("b to hold a micro-step", lambda: "b" in c.stats().claims, 120)
        c.client.release("b")
        metrics = c.client.wait_step(0, timeout_s=300)
        assert_accounted(metrics, first)
        assert metrics.reclaimed == 0  # b finished what it held
        assert c.stats().members["b"] == "parked"
        c.client.submit(1, second, seal=True)
        step1 = c.client.wait_step(1, timeout_s=300)
        assert set(step1.by_member) == {"a"}  # b left: only a trains step 1
        assert step1.version == 2
        assert proc.poll() is None
    (tmp_path / "empty").mkdir()
    with cluster(tiny_model, tmp_path / "empty") as c:
        good = random_micro_steps(71, 2)
        bad = {
            "outside the model's vocabulary": msgspec.structs.replace(
                good[0], input_ids=[10**6] * len(good[0].input_ids)
            ),
            "lengths": msgspec.structs.replace(good[0], weights=good[0].weights[:-1]),
            "lies outside its sequence": msgspec.structs.replace(
                good[0], parents=[-1, 5, *good[0].parents[2:]]
            ),
            "negative, NaN or infinite": msgspec.structs.replace(
                good[0], weights=[float("nan")] * len(good[0].weights)
            ),
        }
        for reason, micro in bad.items():
            with pytest.raises(TrainerError, match=reason):
                c.client.submit(0, [good[1], micro], seal=True)
        raw = zmq.Context.instance().socket(zmq.DEALER)  # not a trainer request at all
        raw.connect(c.address)
        raw.send(b"\x93garbage")
        assert raw.poll(60_000) and b"not a trainer request" in raw.recv()
        raw.close(0)
        c.client.submit(0, good, seal=True)  # nothing of the refused submits went in
        assert c.client.wait_step(0, timeout_s=300).micro_steps == 2


@SLOW
def test_a_step_sealed_with_no_micro_steps_applies_no_update_says_why_and_the_next_step_trains(
    tiny_model: Path, tmp_path: Path
) -> None:
    first, last = random_micro_steps(81, 2), random_micro_steps(82, 2)
    with cluster(tiny_model, tmp_path) as c:
        c.client.submit(0, first, seal=True)
        assert c.client.wait_step(0, timeout_s=300).untrained == ""
        before = c.weights_after(tmp_path / "before")
        c.client.submit(1, [], seal=True, untrained="8 of 8 executions dropped (8x verifier failed to start)")
        empty = c.client.wait_step(1, timeout_s=300)
        assert (empty.micro_steps, empty.tokens, empty.version) == (0, 0, 2)
        assert empty.untrained == "8 of 8 executions dropped (8x verifier failed to start)"
        after = c.weights_after(tmp_path / "after")
        for saved, kept in zip(before, after, strict=True):  # weights and AdamW moments untouched
            assert saved.keys() == kept.keys() and all(torch.equal(saved[k], kept[k]) for k in saved)
        c.client.submit(
            3, [], seal=True
        )  # sealed ahead of its turn, with no reason given: the core names one
        c.client.submit(2, last, seal=True)
        assert c.client.wait_step(2, timeout_s=300).micro_steps == 2
        assert c.client.wait_step(3, timeout_s=300).untrained == "no micro-steps were submitted"
        assert c.stats().step == 4
        got = c.weights_after(tmp_path / "end")
    # two updates, as if the empty steps were never there (the learning rate schedule is flat here)
    state = reference(tiny_model, first)
    train_step(state, last)
    assert_same_update(got, state)


@SLOW
def test_lost_and_repeated_submits_train_each_micro_step_once(tiny_model: Path, tmp_path: Path) -> None:
    steps = [random_micro_steps(91, 12), random_micro_steps(92, 6)]
    chaos = ChaosConfig(trainer_drop=0.3, trainer_duplicate=0.3, seed=13)  # all three faults, more than once
    with (
        cluster(tiny_model, tmp_path) as c,
        TrainerClient(c.address, timeout_s=30, retries=20, chaos=chaos) as driver,
    ):
        metrics = []
        for step, items in enumerate(steps):
            for i in range(0, len(items), 2):  # streamed, two micro-steps a submit
                driver.submit(step, items[i : i + 2], seal=i + 2 >= len(items))
            metrics.append(c.client.wait_step(step, timeout_s=300))
        got = c.weights_after(tmp_path / "ckpt")
        faults = driver.faults.counts()
    assert faults["lost_requests"] and faults["lost_answers"] and faults["duplicated"]  # each fault happened
    assert driver.retried == faults["lost_requests"] + faults["lost_answers"]
    for m, items in zip(metrics, steps, strict=True):
        assert_accounted(m, items)  # each micro-step trained exactly once
    # every copy that reached the core after the first was acknowledged, not taken (a duplicate may land after
    # its step was applied: then no step counts it)
    assert 0 < sum(m.repeated_submits for m in metrics) <= faults["lost_answers"] + faults["duplicated"]
    want = reference(tiny_model, steps[0])
    train_step(want, steps[1])
    assert_same_update(got, want)  # the update of a fault-free run


@SLOW
def test_attached_engines_get_every_update_and_generate_what_a_freshly_loaded_engine_does(
    tiny_model: Path, tmp_path: Path
) -> None:
    import asyncio

    from gyre.engine.engineclient import EngineClient
    from gyre.engine.launcher import launch_embedded
    from gyre.protocol import SamplingParams

    greedy = SamplingParams(max_new_tokens=24, temperature=0.0)
    prompt = [7, 8, 9, 10, 11]

    async def generate(url: str) -> tuple[list[int], str]:
        async with EngineClient(url) as client:
            out = await client.generate(prompt, greedy)
            return out.output_ids, out.meta_info.weight_version

    overrides = ["engine.kv_cache_mem_gib=0.05", "engine.num_threads=1"]
    with cluster(tiny_model, tmp_path) as c, launch_embedded(tiny_model, overrides=overrides) as engine:
        before, version = asyncio.run(generate(engine.url))
        assert version == "0"
        c.client.attach_engine(engine.url)
        for step in range(2):  # a large learning rate, so the greedy output moves
            c.client.submit(step, random_micro_steps(30 + step, 6), seal=True)
            assert c.client.wait_step(step, timeout_s=300).version == step + 1
        saved = c.client.save_checkpoint(tmp_path / "ckpt")
        wait_for("the engine to report version 2", lambda: asyncio.run(generate(engine.url))[1] == "2")
        pushed, _ = asyncio.run(generate(engine.url))
    with launch_embedded(saved, overrides=overrides) as fresh:
        loaded, _ = asyncio.run(generate(fresh.url))
    assert pushed == loaded
    assert pushed != before


@SLOW
def test_a_core_resumed_from_a_checkpoint_makes_the_same_next_update(
    tiny_model: Path, tmp_path: Path
) -> None:
    first, second = random_micro_steps(41, 8), random_micro_steps(42, 8)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with cluster(tiny_model, tmp_path / "a") as c:
        c.client.submit(0, first, seal=True, data_cursor={"executions": 16})
        c.client.wait_step(0, timeout_s=300)
        saved = c.client.save_checkpoint(tmp_path / "after-step-0")
        c.client.submit(1, second, seal=True)
        c.client.wait_step(1, timeout_s=300)
        straight = c.weights_after(tmp_path / "straight")
    resumed = Cluster(tiny_model, tmp_path / "b", core_computes=True, resume=saved)
    try:
        assert resumed.stats().step == 1  # it continues at the next step, with the next version
        with pytest.raises(TrainerError, match="sealed or applied"):
            resumed.client.submit(0, first, seal=True)
        resumed.client.submit(1, second, seal=True)
        assert resumed.client.wait_step(1, timeout_s=300).version == 2
        again = resumed.weights_after(tmp_path / "resumed")
    finally:
        resumed.close()
    for name, tensor in straight[0].items():
        assert torch.equal(tensor, again[0][name]), name  # bit for bit
    for key, tensor in straight[1].items():
        assert torch.equal(tensor, again[1][key]), key


@SLOW
def test_a_satellite_that_left_rejoins_a_later_step_over_the_group_it_kept(
    tiny_model: Path, tmp_path: Path
) -> None:
    import threading

    from gyre.train.satellite import Satellite, SatelliteSummary

    with cluster(tiny_model, tmp_path, core_computes=False) as c:
        satellite = Satellite(c.address, "cell-1", num_threads=1)
        runs: list[SatelliteSummary] = []

        def join() -> threading.Thread:
            thread = threading.Thread(target=lambda: runs.append(satellite.run()))
            thread.start()
            return thread

        thread = join()
        c.client.submit(0, random_micro_steps(51, 4), seal=True)
        assert c.client.wait_step(0, timeout_s=300).by_member == {"cell-1": 4}
        c.client.release("cell-1")
        thread.join(timeout=60)
        group = satellite.group_name
        assert c.stats().members == {"cell-1": "parked"} and runs[0].micro_steps == 4
        thread = join()  # the same process joins again: no new group, the step's weights again
        c.client.submit(1, random_micro_steps(52, 4), seal=True)
        assert c.client.wait_step(1, timeout_s=300).by_member == {"cell-1": 4}
        assert satellite.group_name == group
        c.client.release("cell-1")
        thread.join(timeout=60)
        assert runs[1].micro_steps == 4


@SLOW
def test_with_a_kl_term_satellites_get_the_reference_and_the_update_still_matches(
    tiny_model: Path, tmp_path: Path
) -> None:
    first, second = random_micro_steps(61, 6), random_micro_steps(62, 6)
    with Cluster(tiny_model, tmp_path, core_computes=False, extra=("trainer.loss.kl_coef=0.5",)) as c:
        c.start("sat")
        c.client.submit(0, first, seal=True)  # after this step the weights differ from the reference
        c.client.submit(1, second, seal=True)
        metrics = c.client.wait_step(1, timeout_s=300)
        assert metrics.by_member == {"sat": 6} and metrics.kl > 0
        got = c.weights_after(tmp_path / "ckpt")
    want = reference(tiny_model, first, kl_coef=0.5)
    train_step(want, second)
    assert_same_update(got, want)


@SLOW
def test_a_satellite_sends_one_sum_per_step_however_many_micro_steps_it_computes(
    tiny_model: Path, tmp_path: Path
) -> None:
    items = random_micro_steps(101, 6)
    with cluster(tiny_model, tmp_path, core_computes=False) as c:
        c.start("sat")
        wait_for("the satellite", lambda: len(c.stats().members) == 1)
        c.client.submit(0, items, seal=True)
        metrics = c.client.wait_step(0, timeout_s=300)
        stats = c.stats()
        got = c.weights_after(tmp_path / "ckpt")
    assert metrics.by_member == {"sat": len(items)}
    gradient = stats.weight_bytes  # one fp32 gradient: what the star moved per micro-step
    assert (
        metrics.gradient_bytes_in == stats.gradient_bytes_in == 2 * gradient
    )  # one float64 sum, not 6 gradients
    assert_same_update(got, reference(tiny_model, items))


@SLOW
def test_a_satellite_killed_before_it_sends_its_sum_loses_only_its_micro_steps_and_the_update_matches(
    tiny_model: Path, tmp_path: Path
) -> None:
    items = random_micro_steps(111, 12)
    # 20 s: the timeout is also the healthy "other"'s, started afterwards to compute the whole step
    with cluster(tiny_model, tmp_path, core_computes=False, timeout_s=20.0) as c:
        victim = c.start("victim")
        wait_for("the victim", lambda: len(c.stats().members) == 1)
        c.client.submit(0, items[:5])  # not sealed: it computes all five and holds their sum
        wait_for(
            "the victim to hold five computed micro-steps", lambda: len(c.stats().held.get("victim", [])) == 5
        )
        assert c.stats().done == 0 and c.stats().gradient_bytes_in == 0  # nothing sent yet
        victim.kill()
        # the only member: with no member heard, its silence is judged against ALL_QUIET timeouts (60 s)
        wait_for("the victim to be declared gone", lambda: c.stats().members["victim"] == "gone", 180)
        assert c.stats().pending == 5  # its five are back in the queue
        c.start("other")
        c.client.submit(0, items[5:], seal=True)
        metrics = c.client.wait_step(0, timeout_s=300)
        stats = c.stats()
        got = c.weights_after(tmp_path / "ckpt")
    assert metrics.reclaimed == 5 and metrics.by_member == {"other": len(items)}
    assert (
        metrics.gradient_bytes_in == 2 * stats.weight_bytes
    )  # the survivor's one sum; the victim sent nothing
    assert_same_update(got, reference(tiny_model, items))
