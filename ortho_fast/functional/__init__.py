"""The functional core of ortho_fast: the per-tensor math of each algorithm as functions of tensors
and keyword hyperparameters, no param-group dicts (the role of torch.optim's ``_single_tensor_*``
functions and of optax's pure transforms).

- ``newton_schulz``: batched Newton–Schulz on (..., m, n);
- ``layout``: how a parameter is cut into the matrices Muon orthogonalizes;
- ``muon``: momentum, orthogonalization of a list of matrices, the scaled update;
- ``qr``: Householder / CholeskyQR2 / randomized CholeskyQR and Dion's deterministic draws;
- ``dion``: rank, Q0, right factor, one Dion step on a block (power iteration, error feedback, update);
- ``scalar``: AdamW and Lion updates.

See docs/design.md, "Layers and import rules".
"""
