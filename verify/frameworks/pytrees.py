"""Pytree paths for the optax adapter: the params pytree of a param group, which state leaves
belong to which parameter, and the names they get in ``optimizer.state[p]``.
"""

from __future__ import annotations

__all__ = ["attach_state", "key_tuple", "params_tree", "path_name", "restore_inactive"]


def key_tuple(key_path) -> tuple:
    """A JAX key path as a tuple: dict keys and attribute names as str, sequence indices as int."""
    out = []
    for k in key_path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                v = getattr(k, attr)
                out.append(v if isinstance(v, int) and attr == "idx" else str(v))
                break
        else:
            out.append(str(k))
    return tuple(out)


def path_name(keys: tuple) -> str:
    """"a/b/0/c" for the keys ("a", "b", 0, "c")."""
    return "/".join(str(k) for k in keys)


def params_tree(names, leaves) -> tuple[dict, list[tuple]]:
    """The nested dict of ``leaves`` keyed by ``names`` split at the dots, and each leaf's path.

    Raises
    ------
    ValueError
        Naming ``params`` when two names collide (the same name twice, or one name a prefix of
        another at a dot, "a" and "a.b").
    """
    tree: dict = {}
    paths = []
    for name, leaf in zip(names, leaves):
        keys = tuple(str(name).split("."))
        node = tree
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ValueError(f"params: the name {name!r} runs through the parameter {path_name(keys[:-1])!r}")
        if keys[-1] in node:
            raise ValueError(f"params: the name {name!r} is given twice or is a prefix of another parameter's")
        node[keys[-1]] = leaf
        paths.append(keys)
    return tree, paths


def _owner(keys: tuple, paths) -> tuple | None:
    """The longest parameter path that ``keys`` ends with (None: a leaf of no parameter)."""
    best = None
    for path in paths:
        if len(keys) > len(path) and keys[-len(path):] == path and (best is None or len(path) > len(best)):
            best = path
    return best


def attach_state(jax, state, paths) -> list[tuple[dict, dict]]:
    """Per parameter path: (its own state leaves, the shared leaves of the state nodes it has
    leaves in), each by name. An own leaf is named by its path without the parameter's suffix;
    a shared leaf (no parameter path at its end) by its whole path, and it goes to every parameter
    that has an own leaf under the node holding it."""
    own = {path: {} for path in paths}
    shared = []
    for kp, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        keys = key_tuple(kp)
        owner = _owner(keys, paths)
        if owner is None:
            shared.append((keys, leaf))
        else:
            own[owner][path_name(keys[:-len(owner)]) or "value"] = (keys[:-len(owner)], leaf)
    out = []
    for path in paths:
        prefixes = [k for k, _ in own[path].values()]
        mine = {path_name(keys): leaf for keys, leaf in shared
                if any(pre[:len(keys) - 1] == keys[:-1] for pre in prefixes)}
        out.append(({name: leaf for name, (_, leaf) in own[path].items()}, mine))
    return out


def restore_inactive(jax, new_tree, tree, new_state, state, inactive, paths):
    """The step's new params and state with the parameters in ``inactive`` (paths of parameters
    without a gradient) and their own state leaves as they were before it. A state whose structure
    changed in the step is kept as the transform returned it."""
    tree_map = jax.tree_util.tree_map_with_path
    new_tree = tree_map(lambda kp, new, old: old if key_tuple(kp) in inactive else new, new_tree, tree)
    if jax.tree_util.tree_structure(new_state) == jax.tree_util.tree_structure(state):
        new_state = tree_map(lambda kp, new, old: old if _owner(key_tuple(kp), paths) in inactive else new,
                             new_state, state)
    return new_tree, new_state
