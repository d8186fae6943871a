"""torch ↔ JAX array conversion for the adapters: DLPack (zero-copy where the frameworks allow it),
through numpy (bfloat16 as ml_dtypes') where DLPack is refused, the dtype always kept and every
result a fresh copy, so that neither side sees the other's later writes.
"""

from __future__ import annotations

import numpy as np
import torch

from .extra import require

__all__ = ["DTYPES", "to_jax", "to_torch"]

#: torch dtypes the adapters convert, by JAX / numpy dtype name.
DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "int32": torch.int32, "int64": torch.int64, "uint32": torch.uint32, "bool": torch.bool}


def to_jax(tensor: torch.Tensor, argument: str, what: str = "ortho_verify.frameworks"):
    """A ``jax.Array`` with the values, shape and dtype of ``tensor``, never sharing its memory.

    Parameters
    ----------
    tensor : torch.Tensor
        Any shape; float64 / float32 / bfloat16 / float16 (float64 only in JAX's 64-bit mode).
    argument : str
        The name the error messages give it.
    what : str
        The entry point, for the ImportError naming the extra.

    Returns
    -------
    jax.Array
        On JAX's default device (the CPU in CI), same shape and dtype.

    Raises
    ------
    TypeError
        Naming ``argument`` for a non-tensor, a dtype outside ``DTYPES``, or float64 while
        ``jax_enable_x64`` is off (JAX would compute in float32 instead).
    ImportError
        Naming the extra ``jax`` when jax is missing.
    """
    jax = require("jax", what)
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{argument}: expected a torch.Tensor, got {type(tensor).__name__}")
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise TypeError(f"{argument}: dtype {tensor.dtype} has no JAX counterpart here; expected one of "
                        f"{sorted(DTYPES)}")
    if tensor.dtype in (torch.float64, torch.int64) and not jax.config.jax_enable_x64:
        raise TypeError(f"{argument}: {tensor.dtype} needs JAX's 64-bit mode (jax.config.update('jax_enable_x64', "
                        "True)); without it JAX would silently compute in 32 bits")
    copy = tensor.detach().contiguous().clone()  # JAX may alias DLPack memory: give it a copy of its own
    try:
        out = jax.dlpack.from_dlpack(copy)
    except Exception:  # noqa: BLE001 - a device or dtype DLPack refuses: through numpy on the host
        host = copy.cpu()
        if host.dtype == torch.bfloat16:
            ml_dtypes = require("ml_dtypes", what)
            out = jax.numpy.asarray(host.view(torch.uint16).numpy().view(ml_dtypes.bfloat16))
        else:
            out = jax.numpy.asarray(host.numpy())
    if str(out.dtype) != name:  # never a silent cast
        raise TypeError(f"{argument}: JAX received {out.dtype} for a {tensor.dtype} tensor")
    return out


def to_torch(array, argument: str, device=None, what: str = "ortho_verify.frameworks") -> torch.Tensor:
    """A torch tensor with the values, shape and dtype of a ``jax.Array`` (or numpy array, bfloat16
    as ml_dtypes'), on ``device``, never sharing memory with ``array``.

    Parameters
    ----------
    array : jax.Array or numpy.ndarray
        Any shape, a dtype of ``DTYPES``.
    argument : str
        The name the error messages give the producer of ``array`` (e.g. "fn").
    device : torch.device or str, optional
        Where the result goes (default: the CPU).

    Returns
    -------
    torch.Tensor
        Same shape and dtype.

    Raises
    ------
    TypeError
        Naming ``argument`` when ``array`` is not an array, or its dtype has no torch counterpart here.
    """
    jax = require("jax", what)
    if isinstance(array, np.ndarray):
        array = jax.numpy.asarray(array)
    if not isinstance(array, jax.Array):
        raise TypeError(f"{argument}: returned {type(array).__name__}, expected a jax.Array")
    name = str(array.dtype)
    if name not in DTYPES:
        raise TypeError(f"{argument}: returned an array of dtype {name}, which has no torch counterpart here; "
                        f"expected one of {sorted(DTYPES)}")
    try:
        out = torch.from_dlpack(array).clone()  # the clone: torch's writes must never reach JAX's buffer
    except Exception:  # noqa: BLE001 - through numpy on the host
        host = np.asarray(array)
        out = (torch.from_numpy(host.view(np.uint16).copy()).view(torch.bfloat16) if name == "bfloat16"
               else torch.from_numpy(host.copy()))
    if out.dtype != DTYPES[name]:
        raise TypeError(f"{argument}: torch received {out.dtype} for a JAX {name} array")
    return out if device is None else out.to(device)
