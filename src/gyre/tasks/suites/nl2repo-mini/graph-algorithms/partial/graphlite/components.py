"""Connected and strongly connected components."""


def connected_components(graph):
    seen = set()
    comps = []
    for root in graph:
        if root in seen:
            continue
        seen.add(root)
        comp = [root]
        stack = [root]
        while stack:
            node = stack.pop()
            for nbr in graph.neighbors(node):
                if nbr not in seen:
                    seen.add(nbr)
                    comp.append(nbr)
                    stack.append(nbr)
        order = graph.nodes()
        comps.append(sorted(comp, key=order.index))
    return comps


def strongly_connected_components(graph):
    raise NotImplementedError("TODO: Tarjan")
