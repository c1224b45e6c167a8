"""graphlite: a small weighted graph library."""

from .components import connected_components, strongly_connected_components
from .errors import (
    CycleError,
    EdgeNotFoundError,
    GraphError,
    NegativeWeightError,
    NodeNotFoundError,
    NoPathError,
)
from .graph import Graph
from .paths import dijkstra, shortest_path
from .traversal import bfs, dfs, find_cycle, topological_sort

__all__ = [
    "CycleError",
    "EdgeNotFoundError",
    "Graph",
    "GraphError",
    "NegativeWeightError",
    "NoPathError",
    "NodeNotFoundError",
    "bfs",
    "connected_components",
    "dfs",
    "dijkstra",
    "find_cycle",
    "shortest_path",
    "strongly_connected_components",
    "topological_sort",
]
