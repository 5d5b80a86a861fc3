"""One-off probes on a GPU: the measurements behind a design choice."""
