"""Device samplers, timers and the one throughput report format."""
