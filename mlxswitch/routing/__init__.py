"""Routing: which tier makes each token. `router` and `policies` are pure Python (no mlx, no numpy);
`signals` computes the per-token numbers they read from a tier's logits."""
