"""Measurement primitives: clocks that synchronize correctly, peak memory, run results."""
