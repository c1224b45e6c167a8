"""Weighted shortest paths (Dijkstra)."""

import heapq
import itertools

from .errors import NodeNotFoundError, NoPathError


def dijkstra(graph, source):
    if source not in graph:
        raise NodeNotFoundError(source)
    dist = {source: 0}
    prev = {source: None}
    done = set()
    counter = itertools.count()
    heap = [(0, next(counter), source)]
    while heap:
        d, _, node = heapq.heappop(heap)
        if node in done:
            continue
        done.add(node)
        for nbr in graph.neighbors(node):
            nd = d + graph.weight(node, nbr)
            if nbr not in dist or nd < dist[nbr]:
                dist[nbr] = nd
                prev[nbr] = node
                heapq.heappush(heap, (nd, next(counter), nbr))
    return dist, prev


def shortest_path(graph, source, target):
    dist, prev = dijkstra(graph, source)
    if target not in dist:
        raise NoPathError(f"no path from {source!r} to {target!r}")
    path = [target]
    while path[-1] != source:
        path.append(prev[path[-1]])
    return dist[target], path[::-1]
