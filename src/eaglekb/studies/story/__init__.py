"""The investigation's Phase 0 / Phase 1 story, reproduced on one small target, and recorded.

What one run measures (greedy throughout, one target, one seed):

* datagen for domain A (wiki + chitchat train splits) and domain B (gsm8k + gpqa train splits);
* mapping A built from A's data and mapping B from B's data (same draft vocab size), compared: position
  matches versus set overlap and coverage (the investigation's d2t lesson);
* drafter A trained from scratch on A with mapping A;
* Phase 0: drafter A probed as-is on the B domain (gsm8k-eval prompts, never trained on);
* Phase 1, at EQUAL data and step budgets on B's data, three arms: ``noremap`` (fine-tune A with mapping B
  and no lm_head remap: the investigation's mistake), ``remap`` (fine-tune A after moving lm_head rows by
  target id) and ``scratch`` (mapping B, from scratch); optionally the same three on a small slice of B
  (``b_small`` sequences, same step count);
* per drafter: first-step loss, loss and accuracy curves, final per-step accuracy, simulated accept length,
  and an online probe on gsm8k-eval (accept length, measured cycle time, break-even and the verdict).

Three steps, each a runbook task (``runbooks/story.py``) over the modules here:

1. ``write_prompts`` (``prompt_sets``): the A / B / eval prompts as one prompt-sets file (needs the corpus
   packages, so it runs where they are installed, which need not be the machine that runs the story);
2. ``run`` (``pipeline``, its stages in ``stages`` and ``arms``): everything above, writing ``story.json``
   (``document``) after every stage (a killed run keeps what it finished) and, at the end, as many of the main
   drafters as fit ``export_max_mib`` as ``drafters.tar.partNN`` (``drafters``: 16 MiB pieces);
3. ``baseline_specs`` (``record``): the baselines of a run's output folder as plain dicts, with the provenance
   of the machine that ran it; the runbook validates and writes them through ``eaglekb.kb.baselines``.

``run(StoryConfig(tiny=True), out)`` runs the whole pipeline on CPU with a tiny random Llama and a character
tokenizer (``tiny``), no model or corpus needed, in well under a minute: the numbers are meaningless, the
plumbing is the point. Knows nothing about the task runner or the baselines schema.
"""

from eaglekb.studies.story.config import (
    A_CORPORA,
    ARMS,
    B_CORPORA,
    DRAFTERS_TAR,
    EVAL_SET,
    EXPORT_FILE,
    MAIN_RUNS,
    MAPPING_NOISE,
    PART_BYTES,
    STORY_FILE,
    TINY,
    StoryConfig,
)
from eaglekb.studies.story.document import load
from eaglekb.studies.story.drafters import (
    check_drafters,
    export_drafters,
    export_from_work,
    fit_budget,
    unpack_drafters,
)
from eaglekb.studies.story.pipeline import run, verdicts
from eaglekb.studies.story.prompt_sets import read_prompts, write_prompts
from eaglekb.studies.story.record import baseline_specs, retrained_noise, verdict_noise
from eaglekb.studies.story.tiny import make_tiny, tiny_chat_tokenizer

__all__ = [
    "A_CORPORA", "ARMS", "B_CORPORA", "DRAFTERS_TAR", "EVAL_SET", "EXPORT_FILE", "MAIN_RUNS", "MAPPING_NOISE",
    "PART_BYTES", "STORY_FILE", "TINY", "StoryConfig", "baseline_specs", "check_drafters", "export_drafters",
    "export_from_work", "fit_budget", "load", "make_tiny", "read_prompts", "retrained_noise", "run", "tiny_chat_tokenizer",
    "unpack_drafters", "verdict_noise", "verdicts", "write_prompts",
]
