"""Tune: measure DataLoader settings and batch sizes on the user's data and hardware."""
