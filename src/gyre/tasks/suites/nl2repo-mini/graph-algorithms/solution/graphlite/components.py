"""Connected and strongly connected components."""


def _normalise(graph, groups):
    rank = {node: i for i, node in enumerate(graph.nodes())}
    comps = [sorted(group, key=rank.__getitem__) for group in groups]
    comps.sort(key=lambda comp: rank[comp[0]])
    return comps


def connected_components(graph):
    seen = set()
    groups = []
    for root in graph.nodes():
        if root in seen:
            continue
        seen.add(root)
        group = [root]
        stack = [root]
        while stack:
            node = stack.pop()
            for nbr in graph.neighbors(node) + graph.predecessors(node):
                if nbr not in seen:
                    seen.add(nbr)
                    group.append(nbr)
                    stack.append(nbr)
        groups.append(group)
    return _normalise(graph, groups)


def strongly_connected_components(graph):
    if not graph.directed:
        return connected_components(graph)
    index = {}
    low = {}
    on_stack = set()
    stack = []
    groups = []
    counter = 0
    for root in graph.nodes():
        if root in index:
            continue
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(graph.neighbors(root)))]
        while work:
            node, it = work[-1]
            advanced = False
            for nbr in it:
                if nbr not in index:
                    index[nbr] = low[nbr] = counter
                    counter += 1
                    stack.append(nbr)
                    on_stack.add(nbr)
                    work.append((nbr, iter(graph.neighbors(nbr))))
                    advanced = True
                    break
                if nbr in on_stack:
                    low[node] = min(low[node], index[nbr])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                groups.append(group)
    return _normalise(graph, groups)
