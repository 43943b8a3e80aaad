"""Encoders (loaded or built tiny), task heads, and self-contained model directories."""
