"""Bulk inference: streaming, length-sorted token-budget batches, overlapped tokenization."""
