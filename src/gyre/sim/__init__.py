"""``gyre sim``: the controller's policy driving modelled cells, to compare modes and size clusters we cannot run."""

from gyre.sim.simulate import Cluster, Drift, SimResult, Tasks, Trace, Workload, durations, simulate

__all__ = ["Cluster", "Drift", "SimResult", "Tasks", "Trace", "Workload", "durations", "simulate"]
