"""Examples (text + character offsets) and the readers that produce them."""
from spanflow.data.examples import NerExample, Span
from spanflow.data.io import read_ner
from spanflow.data.records import read_texts

__all__ = ["NerExample", "Span", "read_ner", "read_texts"]
