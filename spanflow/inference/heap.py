"""Keep what a job loaded once out of the garbage collector's full passes."""
from __future__ import annotations

import gc


def settle() -> None:
    """Freeze every object alive now (torch, the model, its tokenizer) into the permanent
    generation. Jobs and servers create many small objects per batch (token ids, offsets,
    records), which set off full collections; each of those otherwise walks every object
    that importing torch leaves, a large share of the cost of turning tokenizer output into
    spans. Call it once, after loading, before the work."""
    gc.collect()
    gc.freeze()
