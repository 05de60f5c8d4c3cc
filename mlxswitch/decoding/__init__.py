"""Decoding: tiers and their caches, the token loop, and the answers built from its steps."""
