"""Planted bugs and user-style implementations: what the checks must catch and what they must pass.

- ``bugs``: ``PLANTED_BUGS``, small realistic mistakes in Newton–Schulz kernels and Muon / Dion optimizers;
- ``muon``: Muon optimizers written independently, correct and with optimizer-level planted errors;
- ``dion``: Dion optimizers written independently of ``ortho_fast``, correct and planted.
"""
