"""Training data from records: trajectory trees, `Jmax` selection, loss weights, packed micro-steps, the loss.

`gyre.train.loss` imports torch; the rest does not.
"""

from gyre.train.prefixtree import Node, TrajectoryTree, select_paths
from gyre.train.step import MicroStep, Rollout, StepData, build_step, build_step_from_config, group_advantages

__all__ = [
    "MicroStep",
    "Node",
    "Rollout",
    "StepData",
    "TrajectoryTree",
    "build_step",
    "build_step_from_config",
    "group_advantages",
    "select_paths",
]
