"""Bottom layer: the one errors module and file I/O (atomic writes, stable JSON, safetensors reads)."""
