import math

import pytest

from graphlite.errors import GraphError, NegativeWeightError, NodeNotFoundError, NoPathError
from graphlite.graph import Graph
from graphlite.paths import dijkstra, shortest_path


def weighted(edges, directed=True):
    g = Graph(directed=directed)
    for u, v, w in edges:
        g.add_edge(u, v, w)
    return g


ROADS = [
    ("A", "B", 4),
    ("A", "C", 2),
    ("C", "B", 1),
    ("B", "D", 5),
    ("C", "D", 8),
    ("C", "E", 10),
    ("D", "E", 2),
    ("E", "F", 3),
]


def test_dijkstra_distances():
    dist, prev = dijkstra(weighted(ROADS), "A")
    assert dist == {"A": 0, "B": 3, "C": 2, "D": 8, "E": 10, "F": 13}
    assert prev == {"A": None, "B": "C", "C": "A", "D": "B", "E": "D", "F": "E"}


def test_shortest_path_reconstruction():
    cost, path = shortest_path(weighted(ROADS), "A", "F")
    assert cost == 13
    assert path == ["A", "C", "B", "D", "E", "F"]


def test_shortest_path_to_self():
    assert shortest_path(weighted(ROADS), "B", "B") == (0, ["B"])


def test_dijkstra_omits_unreachable():
    g = weighted(ROADS)
    g.add_node("island")
    dist, prev = dijkstra(g, "D")
    assert dist == {"D": 0, "E": 2, "F": 5}
    assert "island" not in prev


def test_no_path_error():
    g = weighted(ROADS)
    with pytest.raises(NoPathError):
        shortest_path(g, "F", "A")
    assert issubclass(NoPathError, GraphError)


def test_undirected_shortest_path_uses_both_directions():
    cost, path = shortest_path(weighted(ROADS, directed=False), "F", "A")
    assert cost == 13
    assert path == ["F", "E", "D", "B", "C", "A"]


def test_float_weights():
    g = weighted([("s", "a", 0.5), ("a", "t", 0.25), ("s", "t", 1.0)])
    cost, path = shortest_path(g, "s", "t")
    assert math.isclose(cost, 0.75)
    assert path == ["s", "a", "t"]


def test_zero_weight_edges():
    g = weighted([("s", "a", 0), ("a", "b", 0), ("s", "b", 1)])
    assert shortest_path(g, "s", "b") == (0, ["s", "a", "b"])


def test_longer_path_with_fewer_hops_loses():
    g = weighted([("s", "t", 10), ("s", "a", 1), ("a", "b", 1), ("b", "c", 1), ("c", "t", 1)])
    assert shortest_path(g, "s", "t") == (4, ["s", "a", "b", "c", "t"])


def test_negative_weight_is_rejected():
    g = weighted([("a", "b", 1), ("b", "c", -2)])
    with pytest.raises(NegativeWeightError):
        dijkstra(g, "a")
    with pytest.raises(NegativeWeightError):
        shortest_path(g, "a", "b")
    assert issubclass(NegativeWeightError, GraphError)


def test_negative_weight_anywhere_is_rejected_even_if_unreachable():
    g = weighted([("a", "b", 1), ("x", "y", -1)])
    with pytest.raises(NegativeWeightError):
        dijkstra(g, "a")


@pytest.mark.parametrize("source, target", [("nope", "A"), ("A", "nope")])
def test_missing_nodes(source, target):
    with pytest.raises(NodeNotFoundError):
        shortest_path(weighted(ROADS), source, target)


def test_dijkstra_missing_source():
    with pytest.raises(NodeNotFoundError):
        dijkstra(weighted(ROADS), "nope")


def test_grid_shortest_path():
    g = Graph()
    n = 30
    for r in range(n):
        for c in range(n):
            if c + 1 < n:
                g.add_edge((r, c), (r, c + 1), 1)
            if r + 1 < n:
                g.add_edge((r, c), (r + 1, c), 1)
    cost, path = shortest_path(g, (0, 0), (n - 1, n - 1))
    assert cost == 2 * (n - 1)
    assert len(path) == 2 * n - 1
    assert path[0] == (0, 0) and path[-1] == (n - 1, n - 1)
    assert all(g.has_edge(u, v) for u, v in zip(path, path[1:]))
