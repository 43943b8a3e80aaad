"""HTTP serving: an async token-budget dynamic batcher in front of loaded models."""
