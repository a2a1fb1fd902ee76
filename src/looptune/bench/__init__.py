"""Bench: one workload under several recipes, side by side, in one run."""
