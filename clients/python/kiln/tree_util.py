"""Pytrees: nested tuples, lists, dicts (keys sorted, as JAX) and None, with
every other value a leaf; custom nodes through register_pytree_node."""
import collections

_REGISTRY = {}


def register_pytree_node(cls, flatten, unflatten):
    _REGISTRY[cls] = (flatten, unflatten)


class PyTreeDef:
    __slots__ = ("kind", "aux", "children", "num_leaves")

    def __init__(self, kind, aux, children):
        self.kind, self.aux, self.children = kind, aux, tuple(children)
        self.num_leaves = 1 if kind == "leaf" else sum(c.num_leaves for c in self.children)

    def _key(self):
        return (self.kind, self.aux, tuple(c._key() for c in self.children))

    def __eq__(self, o):
        return isinstance(o, PyTreeDef) and self._key() == o._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return f"PyTreeDef({self._key()!r})"

    def unflatten(self, leaves):
        it = iter(leaves)
        out = self._build(it)
        return out

    def _build(self, it):
        k = self.kind
        if k == "leaf":
            return next(it)
        if k == "none":
            return None
        kids = [c._build(it) for c in self.children]
        if k == "tuple":
            return tuple(kids)
        if k == "list":
            return list(kids)
        if k == "dict":
            return dict(zip(self.aux, kids))
        if k == "namedtuple":
            return self.aux(*kids)
        if k == "custom":
            cls, aux = self.aux
            return _REGISTRY[cls][1](aux, kids)
        raise AssertionError(k)


def _is_namedtuple(x):
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def _flatten(x, leaves, is_leaf):
    if is_leaf is not None and is_leaf(x):
        leaves.append(x)
        return PyTreeDef("leaf", None, ())
    if x is None:
        return PyTreeDef("none", None, ())
    t = type(x)
    if t in _REGISTRY:
        kids, aux = _REGISTRY[t][0](x)
        return PyTreeDef("custom", (t, aux), [_flatten(c, leaves, is_leaf) for c in kids])
    if _is_namedtuple(x):
        return PyTreeDef("namedtuple", t, [_flatten(c, leaves, is_leaf) for c in x])
    if isinstance(x, tuple):
        return PyTreeDef("tuple", None, [_flatten(c, leaves, is_leaf) for c in x])
    if isinstance(x, list):
        return PyTreeDef("list", None, [_flatten(c, leaves, is_leaf) for c in x])
    if isinstance(x, (dict, collections.OrderedDict)):
        keys = tuple(sorted(x.keys()))
        return PyTreeDef("dict", keys, [_flatten(x[k], leaves, is_leaf) for k in keys])
    leaves.append(x)
    return PyTreeDef("leaf", None, ())


def tree_flatten(tree, is_leaf=None):
    leaves = []
    td = _flatten(tree, leaves, is_leaf)
    return leaves, td


def tree_unflatten(treedef, leaves):
    return treedef.unflatten(leaves)


def tree_leaves(tree, is_leaf=None):
    return tree_flatten(tree, is_leaf)[0]


def tree_structure(tree, is_leaf=None):
    return tree_flatten(tree, is_leaf)[1]


def tree_map(f, tree, *rest, is_leaf=None):
    leaves, td = tree_flatten(tree, is_leaf)
    others = [_flatten_up_to(td, r) for r in rest]
    return td.unflatten([f(*xs) for xs in zip(leaves, *others)])


def _flatten_up_to(td, tree):
    """The subtrees of tree at the leaves of td (td must be a prefix)."""
    out = []

    def go(d, x):
        if d.kind == "leaf":
            out.append(x)
            return
        if d.kind == "none":
            if x is not None:
                raise ValueError(f"tree structure mismatch: expected None, got {type(x).__name__}")
            return
        if d.kind == "dict":
            if not isinstance(x, dict) or tuple(sorted(x.keys())) != d.aux:
                raise ValueError(f"tree structure mismatch: expected a dict with keys {d.aux}")
            for k, c in zip(d.aux, d.children):
                go(c, x[k])
            return
        if d.kind == "custom":
            kids, _ = _REGISTRY[d.aux[0]][0](x)
        else:
            kids = list(x) if isinstance(x, (tuple, list)) else None
            if kids is None or len(kids) != len(d.children):
                raise ValueError(f"tree structure mismatch: expected a {d.kind} of "
                                 f"{len(d.children)}, got {type(x).__name__}")
        for c, k in zip(d.children, kids):
            go(c, k)

    go(td, tree)
    return out


def broadcast_prefix(prefix, tree, is_leaf=None):
    """One value of prefix per leaf of tree (prefix is a tree prefix of tree)."""
    pleaves, ptd = tree_flatten(prefix, is_leaf=lambda x: x is None)
    subtrees = _flatten_up_to(ptd, tree)
    out = []
    for p, sub in zip(pleaves, subtrees):
        out.extend([p] * len(tree_leaves(sub, is_leaf)))
    return out


def tree_reduce(f, tree, initializer=None):
    import functools

    leaves = tree_leaves(tree)
    return functools.reduce(f, leaves) if initializer is None else functools.reduce(
        f, leaves, initializer)


def tree_all(tree):
    return all(tree_leaves(tree))


def tree_transpose(outer_treedef, inner_treedef, pytree_to_transpose):
    leaves = tree_leaves(pytree_to_transpose)
    n_in = inner_treedef.num_leaves
    n_out = outer_treedef.num_leaves
    groups = [leaves[i * n_in:(i + 1) * n_in] for i in range(n_out)]
    return inner_treedef.unflatten([outer_treedef.unflatten([g[j] for g in groups])
                                    for j in range(n_in)])


class Partial:
    def __init__(self, func, *args, **kw):
        self.func, self.args, self.keywords = func, args, kw

    def __call__(self, *a, **kw):
        return self.func(*self.args, *a, **{**self.keywords, **kw})
