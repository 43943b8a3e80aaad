"""Tokenize + align (char spans <-> subword labels, windows) and the one token-budget batcher."""
from spanflow.batching.align import Encoded, Window, encode_texts, make_windows, merge_windows
from spanflow.batching.batcher import padding_efficiency, token_budget_batches

__all__ = ["Encoded", "Window", "encode_texts", "make_windows", "merge_windows", "padding_efficiency",
           "token_budget_batches"]
