"""Traversals and topological sorting."""

import heapq
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
    seen = {start}
    order = [start]
    stack = [(start, iter(graph.neighbors(start)))]
    while stack:
        _, it = stack[-1]
        for nbr in it:
            if nbr not in seen:
                seen.add(nbr)
                order.append(nbr)
                stack.append((nbr, iter(graph.neighbors(nbr))))
                break
        else:
            stack.pop()
    return order


def find_cycle(graph):
    """Return a directed cycle as [n0, ..., n0], or None if the graph is acyclic."""
    if not graph.directed:
        raise GraphError("find_cycle requires a directed graph")
    WHITE, GREY, BLACK = 0, 1, 2
    color = {node: WHITE for node in graph}
    for root in graph.nodes():
        if color[root] != WHITE:
            continue
        color[root] = GREY
        path = [root]
        stack = [iter(graph.neighbors(root))]
        while stack:
            for nbr in stack[-1]:
                if color[nbr] == GREY:
                    start = path.index(nbr)
                    return path[start:] + [nbr]
                if color[nbr] == WHITE:
                    color[nbr] = GREY
                    path.append(nbr)
                    stack.append(iter(graph.neighbors(nbr)))
                    break
            else:
                stack.pop()
                color[path.pop()] = BLACK
    return None


def topological_sort(graph):
    if not graph.directed:
        raise GraphError("topological sort requires a directed graph")
    nodes = graph.nodes()
    rank = {node: i for i, node in enumerate(nodes)}
    indegree = {node: graph.in_degree(node) for node in nodes}
    heap = [rank[node] for node in nodes if indegree[node] == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        node = nodes[heapq.heappop(heap)]
        order.append(node)
        for nbr in graph.neighbors(node):
            indegree[nbr] -= 1
            if indegree[nbr] == 0:
                heapq.heappush(heap, rank[nbr])
    if len(order) != len(nodes):
        raise CycleError(find_cycle(graph))
    return order
