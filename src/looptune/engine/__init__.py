"""The training engine: the loop, the step, optimizers and checkpoints."""
