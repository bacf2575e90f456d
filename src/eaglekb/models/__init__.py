"""Models: the shared layers (RoPE, RMSNorm, attention), the EAGLE-3 drafter module, the target adapter,
a target behind a server (the SGLang client), model sources."""
