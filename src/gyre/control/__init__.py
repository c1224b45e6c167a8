"""The elastic controller: the scheduling policy (pure) and, later, the live controller that carries it out."""

from gyre.control.policy import (
    Action,
    CellView,
    Dispatch,
    Mode,
    Observation,
    PolicyConfig,
    ToServe,
    ToTrain,
    decide,
)

__all__ = [
    "Action",
    "CellView",
    "Dispatch",
    "Mode",
    "Observation",
    "PolicyConfig",
    "ToServe",
    "ToTrain",
    "decide",
]
