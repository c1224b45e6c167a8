import pytest

from graphlite.errors import EdgeNotFoundError, GraphError, NodeNotFoundError
from graphlite.graph import Graph


def test_default_graph_is_undirected():
    assert Graph().directed is False
    assert Graph(directed=True).directed is True


def test_add_node_is_idempotent_and_ordered():
    g = Graph()
    for node in ["c", "a", "b", "a"]:
        g.add_node(node)
    assert g.nodes() == ["c", "a", "b"]
    assert len(g) == 3
    assert "a" in g and "z" not in g
    assert list(g) == ["c", "a", "b"]


def test_add_edge_creates_nodes():
    g = Graph(directed=True)
    g.add_edge("x", "y", 2.5)
    assert g.nodes() == ["x", "y"]
    assert g.has_edge("x", "y")
    assert not g.has_edge("y", "x")
    assert g.weight("x", "y") == 2.5


def test_default_weight_is_one():
    g = Graph()
    g.add_edge(1, 2)
    assert g.weight(1, 2) == 1
    assert g.weight(2, 1) == 1


def test_undirected_edges_are_symmetric():
    g = Graph()
    g.add_edge("a", "b", 3)
    assert g.has_edge("b", "a")
    assert g.neighbors("b") == ["a"]
    g.add_edge("b", "a", 7)
    assert g.weight("a", "b") == 7
    assert g.edges() == [("a", "b", 7)]


def test_readding_edge_updates_weight_but_keeps_position():
    g = Graph(directed=True)
    g.add_edge("a", "b", 1)
    g.add_edge("a", "c", 1)
    g.add_edge("a", "b", 5)
    assert g.neighbors("a") == ["b", "c"]
    assert g.weight("a", "b") == 5


def test_directed_edges_listing():
    g = Graph(directed=True)
    g.add_edge("a", "b", 1)
    g.add_edge("b", "a", 2)
    g.add_edge("a", "c", 3)
    assert g.edges() == [("a", "b", 1), ("a", "c", 3), ("b", "a", 2)]


def test_undirected_edges_listed_once_from_earlier_node():
    g = Graph()
    for n in [1, 2, 3]:
        g.add_node(n)
    g.add_edge(3, 1, 4)
    g.add_edge(2, 1, 5)
    g.add_edge(3, 3, 6)
    assert g.edges() == [(1, 3, 4), (1, 2, 5), (3, 3, 6)]


def test_neighbors_and_predecessors_directed():
    g = Graph(directed=True)
    g.add_edge("a", "c")
    g.add_edge("b", "c")
    g.add_edge("c", "d")
    assert g.neighbors("c") == ["d"]
    assert g.predecessors("c") == ["a", "b"]
    assert g.in_degree("c") == 2
    assert g.out_degree("c") == 1


def test_predecessors_equal_neighbors_when_undirected():
    g = Graph()
    g.add_edge("a", "b")
    g.add_edge("c", "a")
    assert g.neighbors("a") == ["b", "c"]
    assert g.predecessors("a") == ["b", "c"]
    assert g.in_degree("a") == g.out_degree("a") == 2


def test_remove_edge():
    g = Graph()
    g.add_edge("a", "b")
    g.remove_edge("b", "a")
    assert not g.has_edge("a", "b") and not g.has_edge("b", "a")
    assert g.nodes() == ["a", "b"]
    assert g.edges() == []


def test_remove_self_loop_undirected():
    g = Graph()
    g.add_edge("a", "a")
    assert g.neighbors("a") == ["a"]
    g.remove_edge("a", "a")
    assert g.neighbors("a") == []


def test_remove_missing_edge_raises():
    g = Graph(directed=True)
    g.add_edge("a", "b")
    with pytest.raises(EdgeNotFoundError):
        g.remove_edge("b", "a")
    with pytest.raises(EdgeNotFoundError):
        g.weight("b", "a")


def test_remove_node_drops_incident_edges():
    g = Graph(directed=True)
    g.add_edge("a", "b")
    g.add_edge("b", "c")
    g.add_edge("c", "b")
    g.remove_node("b")
    assert g.nodes() == ["a", "c"]
    assert g.edges() == []
    assert g.neighbors("a") == [] and g.predecessors("c") == []


@pytest.mark.parametrize("method", ["neighbors", "predecessors", "remove_node", "in_degree", "out_degree"])
def test_missing_node_raises(method):
    g = Graph()
    g.add_node("a")
    with pytest.raises(NodeNotFoundError) as info:
        getattr(g, method)("zzz")
    assert info.value.node == "zzz"


def test_error_hierarchy():
    assert issubclass(NodeNotFoundError, GraphError)
    assert issubclass(NodeNotFoundError, KeyError)
    assert issubclass(EdgeNotFoundError, GraphError)
    assert issubclass(EdgeNotFoundError, KeyError)


def test_has_edge_with_unknown_nodes_is_false():
    g = Graph()
    assert g.has_edge("a", "b") is False
    assert g.has_node("a") is False
