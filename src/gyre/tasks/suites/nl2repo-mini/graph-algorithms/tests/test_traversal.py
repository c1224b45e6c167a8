import pytest

from graphlite.errors import CycleError, GraphError, NodeNotFoundError
from graphlite.graph import Graph
from graphlite.traversal import bfs, dfs, find_cycle, topological_sort


def build(edges, directed=True, nodes=()):
    g = Graph(directed=directed)
    for n in nodes:
        g.add_node(n)
    for u, v in edges:
        g.add_edge(u, v)
    return g


TREE = [("a", "b"), ("a", "c"), ("b", "d"), ("b", "e"), ("c", "f"), ("e", "g")]


def test_bfs_order():
    assert bfs(build(TREE), "a") == ["a", "b", "c", "d", "e", "f", "g"]


def test_dfs_preorder():
    assert dfs(build(TREE), "a") == ["a", "b", "d", "e", "g", "c", "f"]


def test_traversals_only_reach_reachable_nodes():
    g = build([("a", "b"), ("c", "a")])
    assert bfs(g, "a") == ["a", "b"]
    assert dfs(g, "a") == ["a", "b"]
    assert dfs(g, "c") == ["c", "a", "b"]


def test_traversals_handle_cycles_and_undirected():
    g = build([(1, 2), (2, 3), (3, 1), (3, 4)], directed=False)
    assert bfs(g, 1) == [1, 2, 3, 4]
    assert dfs(g, 1) == [1, 2, 3, 4]
    assert bfs(g, 4) == [4, 3, 2, 1]
    assert dfs(g, 4) == [4, 3, 2, 1]


def test_dfs_follows_first_neighbor_fully():
    g = build([("s", "x"), ("s", "y"), ("x", "y"), ("y", "z")])
    assert dfs(g, "s") == ["s", "x", "y", "z"]
    assert bfs(g, "s") == ["s", "x", "y", "z"]


@pytest.mark.parametrize("fn", [bfs, dfs])
def test_traversal_missing_start(fn):
    with pytest.raises(NodeNotFoundError):
        fn(build(TREE), "nope")


def test_dfs_on_long_chain_does_not_hit_recursion_limit():
    g = Graph(directed=True)
    for i in range(20000):
        g.add_edge(i, i + 1)
    assert dfs(g, 0) == list(range(20001))


def test_topological_sort_simple():
    g = build([("shirt", "tie"), ("tie", "jacket"), ("pants", "shoes"), ("pants", "jacket")],
              nodes=["shirt", "pants"])
    order = topological_sort(g)
    assert order == ["shirt", "pants", "tie", "jacket", "shoes"]


def test_topological_sort_ties_broken_by_insertion_order():
    g = build([], nodes=["c", "b", "a"])
    assert topological_sort(g) == ["c", "b", "a"]
    g = build([("root", "z"), ("root", "y"), ("x", "w")], nodes=["root", "x", "y", "z", "w"])
    assert topological_sort(g) == ["root", "x", "y", "z", "w"]


def test_topological_sort_prefers_earliest_ready_node():
    # 'late' is inserted last but becomes ready after 'a'; 'b' was inserted before it.
    g = build([("a", "late"), ("a", "b"), ("late", "c")], nodes=["a", "b", "c", "late"])
    assert topological_sort(g) == ["a", "b", "late", "c"]


def test_topological_sort_respects_every_edge():
    edges = [(i, j) for i in range(12) for j in range(i + 1, 12) if (i * 7 + j) % 3 == 0]
    g = build(edges, nodes=list(range(11, -1, -1)))
    order = topological_sort(g)
    pos = {n: i for i, n in enumerate(order)}
    assert sorted(order) == list(range(12))
    assert all(pos[u] < pos[v] for u, v in edges)


def test_topological_sort_cycle_error():
    g = build([("a", "b"), ("b", "c"), ("c", "d"), ("d", "b")])
    with pytest.raises(CycleError) as info:
        topological_sort(g)
    cycle = info.value.cycle
    assert cycle[0] == cycle[-1]
    assert set(cycle) == {"b", "c", "d"}
    assert len(cycle) == 4
    assert all(g.has_edge(u, v) for u, v in zip(cycle, cycle[1:]))
    assert isinstance(info.value, GraphError)


def test_topological_sort_self_loop():
    g = build([("a", "a")])
    with pytest.raises(CycleError) as info:
        topological_sort(g)
    assert info.value.cycle == ["a", "a"]


def test_topological_sort_requires_directed():
    with pytest.raises(GraphError):
        topological_sort(build([("a", "b")], directed=False))


def test_find_cycle_exact():
    g = build([("a", "b"), ("b", "c"), ("c", "d"), ("d", "b")])
    assert find_cycle(g) == ["b", "c", "d", "b"]
    g = build([("x", "y"), ("y", "z"), ("z", "x"), ("p", "q"), ("q", "p")], nodes=["p"])
    assert find_cycle(g) == ["p", "q", "p"]


def test_find_cycle_none_for_dag():
    assert find_cycle(build(TREE)) is None


def test_cycle_error_matches_find_cycle():
    g = build([("x", "y"), ("y", "z"), ("z", "x")])
    with pytest.raises(CycleError) as info:
        topological_sort(g)
    assert info.value.cycle == find_cycle(g) == ["x", "y", "z", "x"]
