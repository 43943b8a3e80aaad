"""Per task: features -> loss, decode -> spans, metrics."""
