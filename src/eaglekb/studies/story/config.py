"""The story's constants and run configuration: domains, arms, file names, budgets (full and tiny).

Owns ``StoryConfig`` (one run's options; the defaults are the recorded H200 run), the tiny-mode budgets
(``TINY``, ``with_tiny_budgets``), the domain corpora, the Phase 1 arms, the drafters a run exports and the
output file names. Knows nothing about models, data or how the stages run.
"""

from __future__ import annotations

import dataclasses

A_CORPORA = ("wiki", "chitchat")
B_CORPORA = ("gsm8k", "gpqa")
EVAL_SET = "gsm8k-eval"
#: The prompt sets of a story prompts file, in file order.
SETS = ("A", "B", "eval")
ARMS = ("noremap", "remap", "scratch")
#: The drafters a full run exports, most useful first: the remapped arm, A, no remap, scratch.
MAIN_RUNS = ("b-remap", "a-scratch", "b-noremap", "b-scratch")
STORY_FILE = "story.json"
DRAFTERS_TAR = "drafters.tar"
EXPORT_FILE = "drafters-export.json"
PART_BYTES = 16 << 20
#: Mappings built from generated data move between identical runs: greedy generation in bf16 batches is not
#: bit-stable. Two H200 runs shared 3,835 and 3,839 tokens, and A covered 90.19% and 90.06% of B's tokens.
MAPPING_NOISE = {"repeats": 1, "spread_kind": "none", "tolerance_rel": 0.01}


@dataclasses.dataclass
class StoryConfig:
    """One story run. The defaults are the recorded H200 run (about 6 minutes there)."""

    model: str | None = None
    prompts: str | None = None
    work: str = "/tmp/eaglekb-story"
    tiny: bool = False
    device: str = "auto"
    threads: int = 0
    a_max_new_tokens: int = 192
    b_max_new_tokens: int = 256
    max_len: int = 768
    gen_batch: int = 768
    shard_size: int = 256
    draft_vocab_size: int = 8192
    intermediate_size: int = 1536
    ttt_steps: int = 7
    batch_size: int = 32
    a_epochs: float = 6.0
    lr: float = 1e-3
    b_epochs: float = 4.0
    b_lr: float = 1e-3
    b_small: int = 256
    eval_points: int = 8
    val_fraction: float = 0.03
    probe_prompts: int = 8
    probe_new_tokens: int = 96
    probe_steps: int = 3
    soft_limit_s: float = 480.0
    export_drafters: bool = True
    #: what the exported drafters may take in the output folder, in MiB (four smollm2 drafters are 75 MiB;
    #: three are 56.5)
    export_max_mib: float = 60.0
    seed: int = 0


#: Budgets of the tiny CPU mode (replace the defaults that were left unchanged).
TINY = dict(a_max_new_tokens=12, b_max_new_tokens=12, max_len=96, gen_batch=8, shard_size=4, draft_vocab_size=24,
            intermediate_size=0, ttt_steps=3, batch_size=4, a_epochs=2.0, b_epochs=2.0, b_small=4,
            eval_points=2, probe_prompts=2, probe_new_tokens=12, val_fraction=0.1)


def with_tiny_budgets(cfg: StoryConfig) -> StoryConfig:
    """In tiny mode, every budget still at its default takes its ``TINY`` value (in place; returns ``cfg``)."""
    if cfg.tiny:
        defaults = StoryConfig()
        for k, v in TINY.items():
            if getattr(cfg, k) == getattr(defaults, k):
                setattr(cfg, k, v)
    return cfg
