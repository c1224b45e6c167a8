"""The Graph container."""

from .errors import EdgeNotFoundError, NodeNotFoundError


class Graph:
    """A directed or undirected weighted graph with insertion-ordered nodes and edges."""

    def __init__(self, directed=False):
        self._directed = bool(directed)
        self._succ = {}
        self._pred = {}

    @property
    def directed(self):
        return self._directed

    def add_node(self, node):
        if node not in self._succ:
            self._succ[node] = {}
            self._pred[node] = {}

    def add_edge(self, u, v, weight=1):
        self.add_node(u)
        self.add_node(v)
        self._succ[u][v] = weight
        self._pred[v][u] = weight
        if not self._directed:
            self._succ[v][u] = weight
            self._pred[u][v] = weight

    def remove_edge(self, u, v):
        if not self.has_edge(u, v):
            raise EdgeNotFoundError(u, v)
        del self._succ[u][v]
        del self._pred[v][u]
        if not self._directed and u != v:
            del self._succ[v][u]
            del self._pred[u][v]

    def remove_node(self, node):
        self._require(node)
        for v in list(self._succ[node]):
            self._pred[v].pop(node, None)
        for u in list(self._pred[node]):
            self._succ[u].pop(node, None)
        del self._succ[node]
        del self._pred[node]

    def has_node(self, node):
        return node in self._succ

    def has_edge(self, u, v):
        return u in self._succ and v in self._succ[u]

    def weight(self, u, v):
        if not self.has_edge(u, v):
            raise EdgeNotFoundError(u, v)
        return self._succ[u][v]

    def nodes(self):
        return list(self._succ)

    def edges(self):
        result = []
        if self._directed:
            for u, nbrs in self._succ.items():
                for v, w in nbrs.items():
                    result.append((u, v, w))
            return result
        order = {node: i for i, node in enumerate(self._succ)}
        for u, nbrs in self._succ.items():
            for v, w in nbrs.items():
                if order[u] <= order[v]:
                    result.append((u, v, w))
        return result

    def neighbors(self, node):
        self._require(node)
        return list(self._succ[node])

    def predecessors(self, node):
        self._require(node)
        return list(self._pred[node])

    def out_degree(self, node):
        return len(self.neighbors(node))

    def in_degree(self, node):
        return len(self.predecessors(node))

    def _require(self, node):
        if node not in self._succ:
            raise NodeNotFoundError(node)

    def __len__(self):
        return len(self._succ)

    def __contains__(self, node):
        return node in self._succ

    def __iter__(self):
        return iter(list(self._succ))

    def __repr__(self):
        kind = "directed" if self._directed else "undirected"
        return f"<Graph {kind} nodes={len(self)} edges={len(self.edges())}>"
