"""Sentence embeddings: the Embedder, pooling, sentence-transformers directories, the bulk job."""
from spanflow.tasks.embed.model import Embedder

__all__ = ["Embedder"]
