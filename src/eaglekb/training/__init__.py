"""Training: TTT drafter training, lm_head remapping, checkpoints, DDP through torchrun."""
