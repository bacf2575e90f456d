"""The knowledge base: baselines schema and writer, diffs, findings index, rendering (the only pydantic user)."""
