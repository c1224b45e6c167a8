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
