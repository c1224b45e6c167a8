from graphlite.components import connected_components, strongly_connected_components
from graphlite.graph import Graph


def build(edges, directed, nodes=()):
    g = Graph(directed=directed)
    for n in nodes:
        g.add_node(n)
    for u, v in edges:
        g.add_edge(u, v)
    return g


def test_connected_components_undirected():
    g = build([("d", "e"), ("a", "b"), ("c", "a")], directed=False, nodes=["c", "d"])
    g.add_node("z")
    assert connected_components(g) == [["c", "a", "b"], ["d", "e"], ["z"]]


def test_connected_components_empty_graph():
    assert connected_components(Graph()) == []
    assert strongly_connected_components(Graph(directed=True)) == []


def test_directed_connected_components_are_weak():
    g = build([("a", "b"), ("c", "b"), ("x", "y")], directed=True)
    assert connected_components(g) == [["a", "b", "c"], ["x", "y"]]


def test_members_sorted_by_insertion_order():
    g = build([(5, 1), (1, 3), (3, 2)], directed=False, nodes=[3, 2, 1, 5])
    assert connected_components(g) == [[3, 2, 1, 5]]


def test_scc_classic():
    edges = [
        ("a", "b"), ("b", "c"), ("c", "a"),
        ("b", "d"), ("d", "e"), ("e", "f"), ("f", "d"),
        ("g", "f"), ("g", "h"), ("h", "g"),
    ]
    g = build(edges, directed=True)
    assert strongly_connected_components(g) == [["a", "b", "c"], ["d", "e", "f"], ["g", "h"]]


def test_scc_dag_gives_singletons():
    g = build([(1, 2), (2, 3), (1, 3)], directed=True)
    assert strongly_connected_components(g) == [[1], [2], [3]]


def test_scc_self_loop_and_isolated():
    g = build([("a", "a"), ("b", "c")], directed=True, nodes=["z"])
    assert strongly_connected_components(g) == [["z"], ["a"], ["b"], ["c"]]


def test_scc_on_undirected_equals_connected_components():
    g = build([(1, 2), (3, 4), (4, 5)], directed=False)
    assert strongly_connected_components(g) == connected_components(g) == [[1, 2], [3, 4, 5]]


def test_scc_long_cycle_no_recursion_limit():
    g = Graph(directed=True)
    n = 20000
    for i in range(n):
        g.add_edge(i, (i + 1) % n)
    g.add_edge(n, 0)
    comps = strongly_connected_components(g)
    assert comps == [list(range(n)), [n]]


def test_scc_long_chain_no_recursion_limit():
    g = Graph(directed=True)
    for i in range(20000):
        g.add_edge(i, i + 1)
    comps = strongly_connected_components(g)
    assert len(comps) == 20001
    assert comps[:3] == [[0], [1], [2]]


def test_components_do_not_modify_graph():
    g = build([("a", "b"), ("b", "a")], directed=True)
    strongly_connected_components(g)
    connected_components(g)
    assert g.edges() == [("a", "b", 1), ("b", "a", 1)]
