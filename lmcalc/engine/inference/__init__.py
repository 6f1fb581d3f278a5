"""Serving: weights and KV cache per GPU, the largest batch and context."""
