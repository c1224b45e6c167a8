"""Traversals and topological sorting."""

from collections import deque

from .errors import CycleError, GraphError, NodeNotFoundError


def bfs(graph, start):
    if start not in graph:
        raise NodeNotFoundError(start)
    seen = {start}
    order = []
    queue = deque([start])
    while queue:
        node = queue.popleft()
        order.append(node)
        for nbr in graph.neighbors(node):
            if nbr not in seen:
                seen.add(nbr)
                queue.append(nbr)
    return order


def dfs(graph, start):
    if start not in graph:
        raise NodeNotFoundError(start)
    order = []
    seen = set()

    def visit(node):
        seen.add(node)
        order.append(node)
        for nbr in graph.neighbors(node):
            if nbr not in seen:
                visit(nbr)

    visit(start)
    return order


def find_cycle(graph):
    raise NotImplementedError("TODO")


def topological_sort(graph):
    if not graph.directed:
        raise GraphError("topological sort requires a directed graph")
    indegree = {node: graph.in_degree(node) for node in graph}
    queue = deque(node for node in graph if indegree[node] == 0)
    order = []
    while queue:
        node = queue.popleft()
        order.append(node)
        for nbr in graph.neighbors(node):
            indegree[nbr] -= 1
            if indegree[nbr] == 0:
                queue.append(nbr)
    if len(order) != len(graph):
        # TODO: report the actual cycle
        raise CycleError([n for n in graph if n not in order])
    return order
