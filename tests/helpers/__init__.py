"""Plain helpers for the tests (tiny models, datagen inputs, an oracle drafter, the site build)."""
