"""Exception hierarchy for graphlite."""


class GraphError(Exception):
    """Base class for all graphlite errors."""


class NodeNotFoundError(GraphError, KeyError):
    """A node that was asked for is not in the graph."""

    def __init__(self, node):
        super().__init__(node)
        self.node = node

    def __str__(self):
        return f"node not found: {self.node!r}"


class EdgeNotFoundError(GraphError, KeyError):
    """An edge that was asked for is not in the graph."""

    def __init__(self, u, v):
        super().__init__((u, v))
        self.u = u
        self.v = v

    def __str__(self):
        return f"edge not found: {self.u!r} -> {self.v!r}"


class CycleError(GraphError):
    """The graph contains a cycle; ``cycle`` lists it, first node repeated at the end."""

    def __init__(self, cycle):
        super().__init__(f"graph contains a cycle: {cycle!r}")
        self.cycle = cycle


class NegativeWeightError(GraphError):
    """Dijkstra's algorithm was given a graph with a negative edge weight."""


class NoPathError(GraphError):
    """There is no path between the requested nodes."""
