"""``optax_optimizer``: an optax ``GradientTransformation`` factory presented as the torch.optim-style
optimizer class that ``check_optimizer`` constructs and steps, with the transform's state readable
in ``optimizer.state[p]`` under the names of its pytree paths.
"""

from __future__ import annotations

import inspect
from types import MappingProxyType
from typing import Callable

import torch

from .convert import to_jax, to_torch
from .extra import require
from .pytrees import attach_state, key_tuple, params_tree, path_name, restore_inactive

__all__ = ["LAYOUTS", "MOMENTUM_NAMES", "OptaxOptimizer", "optax_optimizer"]

_WHAT = "ortho_verify.frameworks.optax_optimizer"
#: How a 2-D torch parameter W (m, n) = (fan_out, fan_in) is given to the transform: "in_out" as
#: Wᵀ (n, m), the layout of flax ``Dense`` kernels and optax.contrib.muon's default
#: ``MuonDimensionNumbers`` (reduction axis 0 = fan_in); "out_in" as stored. Other ranks: as stored.
LAYOUTS = ("in_out", "out_in")
#: Last path names of a first-moment state leaf (optax: ``mu`` in scale_by_adam / scale_by_muon,
#: ``trace`` in optax.trace): the one such leaf of a parameter is also ``optimizer.state[p]["momentum"]``.
MOMENTUM_NAMES = ("mu", "trace", "momentum")
_NOT_A_HYPERPARAMETER = ("params", "param_names")


def optax_optimizer(transform_factory: Callable, *, layout: str = "in_out", jit: bool = True) -> type:
    """Present an optax ``GradientTransformation`` factory as a torch.optim-style optimizer class.

    ``cls = optax_optimizer(factory)``; ``cls(params, **hyperparameters)`` builds
    ``factory(**hyperparameters)`` (one transform per param group, rebuilt when the group's
    hyperparameters change, e.g. under an lr scheduler), and each ``step()`` runs, per group:
    the parameters and their ``.grad`` converted to JAX arrays (``ortho_verify.frameworks.convert``:
    same dtype, bfloat16 included, copies), ``state = init(params)`` on the first step,
    ``updates, state = update(grads, state, params)``, ``params = optax.apply_updates(params,
    updates)``, and the new values copied back into the torch parameters in place. The JAX state
    is the truth; ``optimizer.state[p]`` is a torch copy of it rebuilt after every step:

    - every state leaf that belongs to ``p`` (its pytree path ends with ``p``'s path in the params
      pytree) under its path without that suffix, e.g. ``"inner_states/muon/inner_state/0/mu"``,
      in torch layout (a 2-D leaf of the transposed shape is transposed back);
    - the leaves without a parameter in the same state node (e.g. ``".../0/count"``), as they are;
    - ``"momentum"``: the one leaf of ``p`` whose last name is in ``MOMENTUM_NAMES``, if one;
    - ``"step"``: the number of steps taken by ``p``'s group (a float32 scalar, as torch.optim).

    The params pytree of a group is a nested dict: named parameters (``model.named_parameters()``)
    by their dotted names split at the dots, others by their index in the group as a string; a
    mask or label pytree given to the factory must have this structure (or be a callable of the
    params, as optax allows). A parameter whose ``.grad`` is None keeps its value and its own
    state leaves; shared leaves (a step count) still advance. Writing into ``optimizer.state``
    does not change the transform's state; ``load_state_dict`` is refused.

    Parameters
    ----------
    transform_factory : callable
        ``transform_factory(**hyperparameters) -> optax.GradientTransformation`` (``init`` and
        ``update``), e.g. ``optax.contrib.muon`` or ``lambda learning_rate, beta, weight_decay:
        optax.contrib.muon(learning_rate, beta=beta, weight_decay=weight_decay, nesterov=False)``.
        Its signature gives the hyperparameter names the class takes, with their defaults
        (a ``**kwargs`` factory takes any name).
    layout : {"in_out", "out_in"}, default "in_out"
        How a 2-D parameter (m, n) is given to the transform (``LAYOUTS``): "in_out" as its
        transpose (n, m), JAX's Dense layout, under which optax.contrib.muon's width scale
        √max(1, fan_out/fan_in) is torch's √max(1, m/n); "out_in" as stored.

    Returns
    -------
    type
        A ``torch.optim.Optimizer`` subclass (``OptaxOptimizer``) called as ``cls(params,
        **hyperparameters)``, for ``check_optimizer(cls, conventions)`` with
        ``conventions.hyperparameter_names`` naming the factory's keywords, e.g.
        ``{"lr": "learning_rate", "momentum": "beta", "weight_decay": "weight_decay"}``. Its class
        attributes ``required`` (names without a default) and ``hyperparameters`` (the others, with
        their defaults) list the keywords it takes; ``transform_factory`` and ``layout`` are kept too.

    Raises
    ------
    ImportError
        Naming the extra ``jax`` (``pip install 'ortho-optim[jax]'``) when jax or optax is missing.
    TypeError
        Naming ``transform_factory`` when it is not callable or its signature cannot be read.
    ValueError
        Naming ``layout`` for a value outside ``LAYOUTS``.

    The class raises, before any parameter or state changes: TypeError for an unknown or missing
    hyperparameter (naming it and the accepted ones), naming ``transform_factory`` when it returns
    something without a callable ``init`` / ``update``; ValueError naming ``params`` for a gradient
    of another shape than its parameter, naming ``transform_factory`` when ``update`` returns
    updates whose pytree or leaf shapes do not match the params (the leaf's path named).
    Exceptions of optax itself (e.g. a mask pytree that does not match the params) propagate with a
    note describing the params pytree.

    Examples
    --------
    >>> import optax
    >>> Muon = optax_optimizer(optax.contrib.muon)
    >>> w = torch.nn.Parameter(torch.randn(8, 4))
    >>> opt = Muon([w], learning_rate=0.02, beta=0.95, weight_decay=0.1)
    >>> w.grad = torch.randn(8, 4)
    >>> opt.step()
    >>> sorted(opt.state[w])
    ['inner_states/muon/inner_state/0/count', 'inner_states/muon/inner_state/0/mu',
     'inner_states/muon/inner_state/0/ns_coeffs', 'momentum', 'step']
    """
    require("jax", _WHAT)
    require("optax", _WHAT)
    if not callable(transform_factory):
        raise TypeError(f"transform_factory: expected a callable returning an optax.GradientTransformation, got "
                        f"{type(transform_factory).__name__}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    try:
        signature = inspect.signature(transform_factory)
    except (TypeError, ValueError):
        raise TypeError("transform_factory: its signature cannot be read; wrap it in a function whose keyword "
                        "arguments are the hyperparameters") from None
    defaults, required, any_name = {}, [], False
    for p in signature.parameters.values():
        if p.kind == p.VAR_KEYWORD:
            any_name = True
        elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in _NOT_A_HYPERPARAMETER:
            defaults[p.name] = p.default
            if p.default is p.empty:
                required.append(p.name)
    qualname = getattr(transform_factory, "__qualname__", type(transform_factory).__name__)
    name = f"optax_optimizer({qualname})"
    if not isinstance(jit, bool):
        raise TypeError(f"jit: expected a bool, got {jit!r}")
    attrs = {"transform_factory": staticmethod(transform_factory), "layout": layout, "jit": jit,
             "accepts_any": any_name,
             "hyperparameters": MappingProxyType({k: v for k, v in defaults.items() if k not in required}),
             "required": tuple(required), "__module__": getattr(transform_factory, "__module__", None) or __name__,
             "__qualname__": name,
             "__doc__": f"{qualname} (an optax transform factory) as a torch.optim-style optimizer: "
                        f"ortho_verify.frameworks.optax_optimizer (layout {layout!r})"}
    return type(name, (OptaxOptimizer,), attrs)


#: Transforms and their jit-compiled init / update by (factory, hyperparameters, jit), for hashable
#: hyperparameters: a second optimizer with the same ones reuses the compiled code (JAX compiles once
#: per pytree structure, shapes and dtypes); the oldest entry goes first past ``_COMPILED_SIZE``.
_COMPILED: dict = {}
_COMPILED_SIZE = 16


def _cache_key(factory, hp: dict, jit: bool):
    """A hashable key of a transform, or None when a hyperparameter is not hashable."""
    key = (factory, tuple(sorted((k, type(v).__name__, v) for k, v in hp.items())), jit)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _same(a, b) -> bool:
    """Whether two hyperparameter values are the same (identity, or equal plain values)."""
    if a is b:
        return True
    plain = (int, float, str, bool, tuple, type(None))
    if isinstance(a, plain) and isinstance(b, plain):
        try:
            return bool(a == b)
        except Exception:  # noqa: BLE001 - e.g. tuples of arrays: not plain after all
            return False
    return False


class OptaxOptimizer(torch.optim.Optimizer):
    """The base of the classes ``optax_optimizer`` returns (see there); not used directly."""

    transform_factory = None
    hyperparameters: dict = {}
    required: tuple = ()
    accepts_any = False
    layout = "in_out"
    jit = True

    def __init__(self, params, **hyperparameters):
        if type(self).transform_factory is None:
            raise TypeError("OptaxOptimizer: build the class with ortho_verify.frameworks.optax_optimizer(factory)")
        known = set(self.hyperparameters) | set(self.required)
        unknown = [k for k in hyperparameters if k not in known and not self.accepts_any]
        if unknown:
            raise TypeError(f"{type(self).__qualname__}: unexpected keyword argument {unknown[0]!r}; the transform "
                            f"factory's signature takes {sorted(known)}")
        missing = [k for k in self.required if k not in hyperparameters]
        if missing:
            raise TypeError(f"{type(self).__qualname__}: missing hyperparameter(s) {missing}, required by the "
                            "transform factory's signature")
        super().__init__(params, {**self.hyperparameters, **hyperparameters})
        self._jax_state: dict[int, object] = {}
        self._built: dict[int, tuple] = {}
        self._steps: dict[int, int] = {}
        for i, group in enumerate(self.param_groups):
            self._transform(i, group)  # TypeError naming transform_factory now, not at the first step

    def _hyperparameters(self, group) -> dict:
        return {k: v for k, v in group.items() if k not in _NOT_A_HYPERPARAMETER}

    def _transform(self, i: int, group):
        """The group's transform, rebuilt when its hyperparameters changed."""
        hp = self._hyperparameters(group)
        built = self._built.get(i)
        if built is not None and built[0].keys() == hp.keys() and all(_same(built[0][k], hp[k]) for k in hp):
            return built[1]
        key = _cache_key(self.transform_factory, hp, self.jit)
        compiled = _COMPILED.get(key) if key is not None else None
        if compiled is None:
            tx = self.transform_factory(**hp)
            missing = [n for n in ("init", "update") if not callable(getattr(tx, n, None))]
            if missing:
                raise TypeError(f"transform_factory: returned {type(tx).__name__} without a callable "
                                f"{' or '.join(missing)}; expected an optax.GradientTransformation "
                                "(init(params) -> state, update(updates, state, params) -> (updates, state))")
            jax = require("jax", _WHAT)
            compiled = (tx, jax.jit(tx.init), jax.jit(tx.update)) if self.jit else (tx, tx.init, tx.update)
            if key is not None:
                while len(_COMPILED) >= _COMPILED_SIZE:
                    _COMPILED.pop(next(iter(_COMPILED)))
                _COMPILED[key] = compiled
        self._built[i] = (hp, compiled)
        return compiled

    def _jax_leaf(self, t: torch.Tensor, argument: str):
        return to_jax(t.mT if self.layout == "in_out" and t.ndim == 2 else t, argument, _WHAT)

    def _torch_leaf(self, leaf, like: torch.Tensor, argument: str) -> torch.Tensor:
        t = to_torch(leaf, argument, like.device, _WHAT)
        if self.layout == "in_out" and like.ndim == 2 and t.ndim == 2 and tuple(t.shape) == tuple(like.shape[::-1]):
            t = t.mT.contiguous()
        return t

    def _plan(self, i: int, group):
        """Everything one group's step computes, before anything is written: (params, new values,
        new JAX state, param paths)."""
        jax = require("jax", _WHAT)
        optax = require("optax", _WHAT)
        params = group["params"]
        names = group.get("param_names") or [str(j) for j in range(len(params))]
        for name, p in zip(names, params):
            g = p.grad
            if g is not None and (g.is_sparse or tuple(g.shape) != tuple(p.shape)):
                raise ValueError(f"params: the gradient of {name!r} is {'sparse' if g.is_sparse else tuple(g.shape)}, "
                                 f"expected a dense gradient of the parameter's shape {tuple(p.shape)}")
        _, init, update = self._transform(i, group)
        tree, paths = params_tree(names, [self._jax_leaf(p, f"params[{n!r}]") for n, p in zip(names, params)])
        grads, _ = params_tree(names, [self._jax_leaf(p.grad if p.grad is not None else torch.zeros_like(p),
                                                      f"params[{n!r}].grad") for n, p in zip(names, params)])
        state = self._jax_state.get(i)
        try:
            if state is None:  # committed to the params' device, as update's outputs are: one compilation
                leaves = jax.tree_util.tree_leaves(tree)
                state = init(tree)
                state = jax.device_put(state, next(iter(leaves[0].devices()))) if leaves else state
            updates, new_state = update(grads, state, tree)
        except Exception as err:
            if hasattr(err, "add_note"):
                err.add_note(f"{_WHAT}: the params pytree of group {i} is a nested dict with the leaf paths "
                             f"{[path_name(p) for p in paths][:8]}{' ...' if len(paths) > 8 else ''}; a mask or label "
                             "pytree given to the transform must have this structure")
            raise
        _check_updates(jax, updates, tree)
        new_tree = optax.apply_updates(tree, updates)
        inactive = {path for path, p in zip(paths, params) if p.grad is None}
        if inactive:
            new_tree, new_state = restore_inactive(jax, new_tree, tree, new_state, state, inactive, paths)
        leaves = {key_tuple(kp): leaf for kp, leaf in jax.tree_util.tree_flatten_with_path(new_tree)[0]}
        values = [self._torch_leaf(leaves[path], p, "transform_factory") for path, p in zip(paths, params)]
        for path, p, v in zip(paths, params, values):
            if v.shape != p.shape or v.dtype != p.dtype:
                raise ValueError(f"transform_factory: the new value of {path_name(path)!r} is {tuple(v.shape)} "
                                 f"{v.dtype}, expected the parameter's {tuple(p.shape)} {p.dtype}")
        return params, values, new_state, paths

    @torch.no_grad()
    def step(self, closure=None):
        """One step of every group's transform on the parameters' ``.grad`` (groups without any
        gradient are skipped). ``closure``: re-evaluates the loss (with grad enabled) and returns it."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        plans = [(i, self._plan(i, group)) for i, group in enumerate(self.param_groups)
                 if any(p.grad is not None for p in group["params"])]
        for i, (params, values, new_state, paths) in plans:  # nothing above changed a parameter or the state
            for p, v in zip(params, values):
                p.copy_(v)
            self._jax_state[i] = new_state
            self._steps[i] = self._steps.get(i, 0) + 1
            self._publish(i, params, paths, new_state)
        return loss

    def _publish(self, i: int, params, paths, state) -> None:
        """``self.state[p]`` from the group's JAX state (see ``optax_optimizer``)."""
        jax = require("jax", _WHAT)
        for p, (own, shared) in zip(params, attach_state(jax, state, paths)):
            view = {name: self._torch_leaf(leaf, p, "transform_factory") for name, leaf in own.items()}
            view.update({name: to_torch(leaf, "transform_factory", p.device, _WHAT) for name, leaf in shared.items()})
            first = [name for name in own if name.rsplit("/", 1)[-1] in MOMENTUM_NAMES]
            if len(first) == 1 and "momentum" not in view:
                view["momentum"] = view[first[0]]
            view["step"] = torch.tensor(float(self._steps[i]))
            self.state[p] = view

    @property
    def jax_state(self) -> dict:
        """The transforms' own states (optax pytrees) by param-group index (empty before the first step)."""
        return dict(self._jax_state)

    def load_state_dict(self, state_dict) -> None:
        """Refused: ``optimizer.state`` is a copy of the transform's JAX state, which it cannot rebuild.

        Raises
        ------
        NotImplementedError
            Always.
        """
        raise NotImplementedError(f"{type(self).__qualname__}: load_state_dict is not supported; the state is the "
                                  "transform's JAX pytree (optimizer.jax_state), checkpoint it with JAX")


def _check_updates(jax, updates, tree) -> None:
    """ValueError naming ``transform_factory`` when ``updates`` does not match the params pytree."""
    want, got = jax.tree_util.tree_structure(tree), jax.tree_util.tree_structure(updates)
    if want != got:
        raise ValueError(f"transform_factory: update returned updates whose pytree does not match the params: "
                         f"got {got}, expected {want}")
    for (kp, u), p in zip(jax.tree_util.tree_flatten_with_path(updates)[0], jax.tree_util.tree_leaves(tree)):
        if getattr(u, "shape", None) != p.shape:
            raise ValueError(f"transform_factory: update returned an update of shape {getattr(u, 'shape', None)} for "
                             f"{path_name(key_tuple(kp))!r}, whose parameter is {p.shape} (in the transform's layout)")
