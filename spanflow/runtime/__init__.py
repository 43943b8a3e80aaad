"""Runtime choices, made once per command before any model loads: device, precision,
quantization, token budget, backend."""
