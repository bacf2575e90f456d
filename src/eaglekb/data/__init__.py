"""Data: prompt corpora, prompt files and sets, the chat template, self-distilled generation, features, the datagen
run, vocab counts."""
