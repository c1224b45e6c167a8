"""`gyre quickstart`'s recipe is a valid configuration whose phases share one prompt profile and one held-out set."""

from __future__ import annotations

from pathlib import Path

from gyre.driver.quickstart import EVAL_SUITE, recipe


def test_the_recipe_configures_a_window_stage_and_lean_elastic_rl(tmp_path: Path) -> None:
    cfg = recipe(tmp_path, "models/tiny")
    assert (
        cfg.sft.journals == [str(tmp_path / "demos")]
        and cfg.sft.window_tokens > 0
        and cfg.sft.window_steps > 0
    )
    assert cfg.run.agent_profile == "lean" and cfg.run.eval_suite == EVAL_SUITE
    assert cfg.controller.mode == "elastic" and cfg.cells.count >= 2
    assert cfg.run.eval_tasks >= 64 and cfg.run.eval_seed is not None  # paired, on enough held-out tasks
    short = recipe(tmp_path, "models/tiny", short=True)
    assert short.run.steps < cfg.run.steps and short.run.eval_tasks < cfg.run.eval_tasks
    # the same code path: SFT's stages and RL's settings are the full recipe's
    assert (
        short.sft.window_steps == cfg.sft.window_steps
        and short.run.agent_temperature == cfg.run.agent_temperature
    )
    seeded = recipe(tmp_path, "models/tiny", seed=3)
    assert (seeded.run.seed, seeded.sft.seed, seeded.trainer.seed, seeded.run.eval_seed) == (3, 3, 3, 3)
    assert "engine.seed=3" in seeded.cells.engine_overrides
