"""Models: a source (embedded, GGUF, mlx-lm dir, hub id) becomes a loaded model, geared or not."""
