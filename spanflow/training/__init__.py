"""The training loop shared by every task, its options, precision policy and checkpoints."""
