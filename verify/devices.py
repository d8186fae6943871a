"""Where the checked code runs: ``device=`` of the checks and ``ortho-verify --device``.

The judge's inputs are made on the CPU in float64 (``ortho_verify.inputs.examples``), rounded to the
input dtype, moved to the device for the call, and the results moved back: the oracle
(``ortho_ref``) always runs on the CPU in float64. ``resolve_device`` rejects a device that
cannot run before any work; ``describe_device`` names it in the report (device, its name, the
torch and CUDA versions).
"""

from __future__ import annotations

import platform

import torch

__all__ = ["describe_device", "device_label", "resolve_device"]


def resolve_device(device, argument: str = "device") -> torch.device:
    """The ``torch.device`` of a ``device=`` argument (a string such as "cpu", "cuda", "cuda:1", or a
    ``torch.device``; None is the CPU), checked usable: CUDA needs ``torch.cuda.is_available()`` and
    an index below ``torch.cuda.device_count()``; "meta" holds no values and is refused; any other
    type must allocate a tensor. Runs nothing else.
    Raises: ValueError naming ``argument`` (an unknown device string, an unusable device) or
    TypeError naming it (neither str, torch.device nor None)."""
    if device is None:
        return torch.device("cpu")
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"{argument}: expected a str or torch.device such as 'cpu' or 'cuda:0', got {device!r}")
    try:
        dev = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"{argument}: not a torch device: {device!r} ({err})") from None
    if dev.type == "cpu":
        return dev
    if dev.type == "meta":
        raise ValueError(f"{argument}: 'meta' tensors hold no values, a kernel cannot be checked on them")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{argument}: {str(dev)!r} requested but CUDA is not available in this torch "
                             f"({torch.__version__}, built with CUDA {torch.version.cuda}); use 'cpu'")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise ValueError(f"{argument}: {str(dev)!r} requested but only {count} CUDA device(s) are visible")
        return dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())
    try:
        torch.empty(1, device=dev)
    except Exception as err:  # any backend's own error: the device is unusable here
        raise ValueError(f"{argument}: {str(dev)!r} is not usable here ({type(err).__name__}: {err})") from None
    return dev


def describe_device(device) -> dict:
    """What the report says about where the code ran: ``device`` ("cpu", "cuda:0"), ``name`` (the
    GPU's ``torch.cuda.get_device_name``, else the CPU's ``platform.processor()`` or machine),
    ``torch`` (``torch.__version__``), ``cuda`` (``torch.version.cuda``, None for a CPU-only
    build) and, on CUDA, ``capability`` ("9.0") and ``tf32_matmul`` (whether float32 matmuls may
    use TF32: ``torch.backends.cuda.matmul.allow_tf32``)."""
    dev = resolve_device(device)
    info = {"device": str(dev), "torch": torch.__version__, "cuda": torch.version.cuda}
    if dev.type == "cuda":
        major, minor = torch.cuda.get_device_capability(dev)
        matmul = torch.backends.cuda.matmul
        reduced = [name for name, flag in (("bfloat16", "allow_bf16_reduced_precision_reduction"),
                                           ("float16", "allow_fp16_reduced_precision_reduction"))
                   if bool(getattr(matmul, flag, False))]
        info.update(name=torch.cuda.get_device_name(dev), capability=f"{major}.{minor}",
                    tf32_matmul=bool(matmul.allow_tf32), reduced_precision_reduction=reduced)
    else:
        info["name"] = platform.processor() or platform.machine() or dev.type
    return info


def device_label(info: dict) -> str:
    """One line for a report's ``device`` (printed by its summary): "cuda:0 (NVIDIA H100 80GB HBM3; torch 2.11.0, CUDA
    13.0)", with "; TF32 matmuls on" when float32 matmuls on that GPU may use TF32 (declare ``dtype="high"``)."""
    cuda = f", CUDA {info['cuda']}" if info.get("cuda") else ", no CUDA"
    tf32 = "; TF32 matmuls on" if info.get("tf32_matmul") else ""
    return f"{info['device']} ({info['name']}; torch {info['torch']}{cuda}{tf32})"
