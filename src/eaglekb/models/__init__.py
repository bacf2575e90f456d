"""Models: the shared layers (RoPE, RMSNorm, attention), the EAGLE-3 drafter module, the target adapter, model sources."""
