"""eaglekb: a knowledge base with executable runbooks for EAGLE-3 speculative decoding.

The library: baselines (schema and I/O), viability arithmetic, model sources,
drafters, mappings, the speculative decoding engine. It never imports the task
runner (invoke), the docs tool (mkdocs) or runbooks/.
"""

__version__ = "0.1.0"
