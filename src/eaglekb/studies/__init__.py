"""Studies: multi-stage recipes built from the layers below (the story, the default drafter)."""
