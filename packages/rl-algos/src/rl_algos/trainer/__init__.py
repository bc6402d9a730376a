"""The single-controller trainer: role workers, the RL loop, checkpoints and metrics."""
