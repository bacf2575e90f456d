"""Data: prompt corpora, prompt files, self-distilled generation and features, vocab counts."""
