"""Routing: which tier makes each token. `registry`, `router`, `policies` and `walk` are pure Python
(no mlx, no numpy); `signals` computes the per-token numbers they read from a tier's logits."""
