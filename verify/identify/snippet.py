"""Python a user can paste to run the judge under an identified declaration."""

from __future__ import annotations

import torch

__all__ = ["declaration_snippet", "format_value"]


def format_value(value) -> str:
    """A declaration value as Python source: torch dtypes as ``torch.<name>``, tables row by row."""
    if isinstance(value, torch.dtype):
        return f"torch.{str(value).removeprefix('torch.')}"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], (list, tuple)):
        return "[" + ", ".join("(" + ", ".join(repr(float(v)) for v in row) + ")" for row in value) + "]"
    return repr(value)


def declaration_snippet(fn, decl: dict, source: str | None = None) -> str:
    """Lines that import ``fn`` (from ``source`` "module:attr" when given, else its ``__module__`` and
    ``__qualname__`` where those name it) and run ``check_orthogonalizer`` under ``decl``."""
    if source and ":" in source:
        module, attr = source.split(":", 1)
    else:
        module, attr = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    name = attr.split(".")[-1] if attr and attr.isidentifier() else "fn"
    head = ["import torch", "from ortho_verify import check_orthogonalizer"]
    if module and attr and attr.isidentifier() and module != "__main__":
        head.append(f"from {module} import {attr}")
    else:
        head.append("fn = ...  # your kernel: (..., m, n) tensor -> (..., m, n) tensor")
        name = "fn"
    args = [name] + [f"{k}={format_value(v)}" for k, v in decl.items()]
    lines, line = [], "report = check_orthogonalizer("
    for i, a in enumerate(args):
        piece = a + (", " if i < len(args) - 1 else ")")
        if len(line) + len(piece) > 78:
            lines.append(line.rstrip())
            line = "    "
        line += piece
    lines.append(line)
    return "\n".join(head + lines + ["assert report.passed, report.summary()"])
