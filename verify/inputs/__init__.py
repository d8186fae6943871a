"""The judge's inputs: matrices with prescribed spectra, real gradients of a small GPT and their cache.

- ``spectra``: test matrices with prescribed singular values (numpy only);
- ``examples``: the spectrum families, ``SpectralExample`` and ``build_example``;
- ``arrays``: torch <-> float64 numpy, and the deterministic auxiliary arrays of a check input;
- ``corpus``: the pinned, generated training text;
- ``data``: the byte-level GPT trained on it and its captured gradients (``real_gradients``);
- ``gradient_cache``: the on-disk cache of those gradients.

The hypothesis strategies built on these stay at ``ortho_verify.strategies``.
"""
