"""The param-group layer of ortho_fast: each group's options validated and resolved once
(``options``), the group functions of each algorithm (``muon``, ``dion``, ``scalar``), the
registry of algorithms (``algorithms``), the one check-then-step driver (``driver``) and the
checked param-group / state-dict operations (``state``). Below the optimizer classes and below
``ortho_fast.distributed``; imports only the functional core. See docs/design.md, "Layers and
import rules"."""
