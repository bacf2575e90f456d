"""On-disk formats: drafter checkpoints, draft-vocab mappings, dataset shards, header-only inspection."""
