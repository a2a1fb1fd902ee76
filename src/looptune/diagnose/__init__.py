"""Diagnose: run a user's unmodified training script with probes; say where each step's time goes."""
