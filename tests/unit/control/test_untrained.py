"""Why a step trained nothing, as its metrics line says it."""

from gyre.control.loop import untrained_reason


def test_the_commonest_reasons_come_first_with_counts() -> None:
    dropped = ["verifier failed to start"] * 3 + ["crashed: quota"] * 2 + ["a", "b"]
    assert untrained_reason(8, dropped) == (
        "7 of 8 executions dropped (3x verifier failed to start; 2x crashed: quota; 1x a; 1 more), "
        "the other 1 gave no trainable tokens"
    )


def test_a_step_with_nothing_dropped_and_nothing_to_train_says_so() -> None:
    assert untrained_reason(4, []) == "its 4 executions gave no trainable tokens"


def test_a_step_whose_groups_all_scored_alike_says_there_was_nothing_to_learn() -> None:
    assert untrained_reason(8, [], alike=8) == (
        "every group scored alike (advantage 0: nothing to learn, nothing computed)"
    )
    assert untrained_reason(8, ["crashed: x"], alike=7).endswith("; 1 dropped")
