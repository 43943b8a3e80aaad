"""One reader per input format; each yields NerExample or raw texts."""
