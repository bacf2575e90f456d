"""Measurement: run setup, probe, bench, viability arithmetic, the SGLang backend, provenance."""
