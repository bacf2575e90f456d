"""The run's state and its first stages: setup, datagen A and B, and the two mappings compared.

Owns ``RunState`` (everything the stages share: config, folders, prompt sets, device, the story document,
the log) and the stages that make the data: ``start``, ``generate_data``, ``build_mappings``. Each stage
reads and extends the state and records itself in story.json. Knows nothing about training or probing
(``eaglekb.studies.story.arms``) or the order of the stages (``eaglekb.studies.story.pipeline``).
"""

from __future__ import annotations

import dataclasses
import gc
import time
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm.auto import tqdm

from eaglekb.data import datagen, prompts, vocab
from eaglekb.data.corpora import PromptSet
from eaglekb.data.generation import load_target
from eaglekb.formats import mapping, mapping_compare
from eaglekb.io.errors import BadInput
from eaglekb.measure import provenance
from eaglekb.studies.story.config import StoryConfig, with_tiny_budgets
from eaglekb.studies.story.document import StoryDoc, story_env
from eaglekb.studies.story.prompt_sets import read_prompts
from eaglekb.studies.story.tiny import make_tiny


@dataclasses.dataclass
class RunState:
    """What the stages of one run share; ``data`` and ``a_drafter`` fill in as the stages finish."""

    cfg: StoryConfig
    out: Path
    work: Path
    story: StoryDoc
    sets: dict[str, PromptSet]
    dev: str
    env: dict[str, Any]
    t_start: float
    log: Callable[[str], None] | None = None
    data: dict[str, Path] = dataclasses.field(default_factory=dict)
    a_drafter: Path | None = None

    @property
    def gpu(self) -> bool:
        return self.dev == "cuda"

    @property
    def dtype(self) -> str:
        return "bfloat16" if self.gpu else "float32"

    @property
    def eval_file(self) -> Path:
        return self.work / "eval-prompts.jsonl"

    def elapsed(self) -> float:
        return time.perf_counter() - self.t_start

    def past_soft_limit(self) -> bool:
        return self.elapsed() > self.cfg.soft_limit_s

    def say(self, msg: str) -> None:
        """One timestamped log line (through the progress bar's writer when there is one)."""
        if self.log:
            line = f"[{time.strftime('%H:%M:%S')} +{self.elapsed():6.1f}s] {msg}"
            if self.story.bar is not None:
                tqdm.write(line)
            else:
                self.log(line)

    def free_memory(self) -> None:
        """Collect garbage and, on a GPU, return the cached blocks (between the stages' models)."""
        gc.collect()
        if self.gpu:
            torch.cuda.empty_cache()


def _inputs(cfg: StoryConfig, work: Path) -> dict[str, PromptSet]:
    """The prompt sets, after writing the tiny target and prompts in tiny mode; refuses a missing input."""
    if cfg.tiny:
        model, prompts_file = make_tiny(work)
        cfg.model, cfg.prompts = str(model), str(prompts_file)
    if not (cfg.model and cfg.prompts):
        raise BadInput("missing option", where="--model/--prompts", expected="a target folder and a prompts file "
                       "(or --tiny)", found=f"model={cfg.model!r}, prompts={cfg.prompts!r}")
    return read_prompts(Path(cfg.prompts))


def start(cfg: StoryConfig, out: str | Path, *, command: str | None, log: Callable[[str], None] | None,
          progress: bool, t_start: float) -> RunState:
    """Budgets, folders, threads, inputs, device, provenance, story.json and the eval prompts file."""
    with_tiny_budgets(cfg)
    work, out = Path(cfg.work), Path(out)
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    sets = _inputs(cfg, work)
    dev = "cuda" if torch.cuda.is_available() and not cfg.tiny and cfg.device != "cpu" else "cpu"
    prov = provenance.capture(command=command)
    env = story_env(prov)
    st = RunState(cfg=cfg, out=out, work=work, story=StoryDoc(out, cfg, env, prov, t_start), sets=sets, dev=dev,
                  env=env, t_start=t_start, log=log)
    if progress:  # load, datagen x2, mappings, A and its probe, 3 arms + probes, small arms, export
        st.story.bar = tqdm(total=12 + (3 if cfg.b_small else 0) + (1 if cfg.export_drafters else 0),
                            desc="story stages", unit="stage")
    st.say(f"torch {env['torch']}, device {dev} ({env['gpu']}); work {work}, out {out}")
    st.say(f"prompts: A {len(sets['A'])}, B {len(sets['B'])}, eval {len(sets['eval'])}")
    prompts.write_prompts_file(st.eval_file, sets["eval"].prompts[: cfg.probe_prompts])
    st.story.doc["prompts"] = {k: v.manifest for k, v in sets.items()}
    return st


def _datagen_domain(st: RunState, target, dom: str, max_new_tokens: int) -> None:
    """Greedy responses and features for one domain's prompts into ``work/data-DOM``; its story record."""
    cfg, sets = st.cfg, st.sets[dom.upper()]
    dcfg = datagen.DatagenConfig(max_new_tokens=max_new_tokens, max_len=cfg.max_len, batch_size=cfg.gen_batch,
                                 shard_size=cfg.shard_size, mode="greedy", dtype=st.dtype)
    t0 = time.perf_counter()
    st.data[dom] = st.work / f"data-{dom}"
    man = datagen.run(target, sets, st.data[dom], dcfg, progress=False)
    dt = time.perf_counter() - t0
    rep = {k: v for k, v in datagen.storage_report(man).items() if v is not None}
    st.story.doc["datagen"][dom] = {
        "config": {**dcfg.__dict__, "model": str(cfg.model), "device": st.dev, "gpu": st.env["gpu"],
                   "prompts": sets.manifest},
        "metrics": {**rep, "stage_wall_s": round(dt, 2)}, "env": st.env,
        "summary": f"domain {dom.upper()}: {rep['sequences_count']} sequences, {rep['tokens_count']} tokens, "
                   f"generate {rep.get('generate_tok_s')} tok/s on {st.env['gpu'] or st.dev}"}
    st.say(f"datagen {dom.upper()}: {dt:.1f} s, {rep['sequences_count']} seqs, {rep['tokens_count']} tokens, "
           f"{rep['loss_tokens_count']} loss tokens, generate {rep.get('generate_tok_s')} tok/s")
    st.story.stage(f"datagen_{dom}", dt)


def generate_data(st: RunState) -> None:
    """Stage 1: load the target once, regenerate domain A then domain B (greedy), free the target."""
    t0 = time.perf_counter()
    target = load_target(st.cfg.model, device=st.dev, dtype=st.dtype)
    st.story.stage("load_target", time.perf_counter() - t0)
    for dom, new in (("a", st.cfg.a_max_new_tokens), ("b", st.cfg.b_max_new_tokens)):
        _datagen_domain(st, target, dom, new)
    del target
    st.free_memory()


def build_mappings(st: RunState) -> None:
    """Stage 2: mapping A from A's data and B from B's (same size), compared: positions, sets, coverage."""
    t0 = time.perf_counter()
    maps, counts = {}, {}
    for dom in ("a", "b"):
        counts[dom] = vocab.counts_from_dataset(st.data[dom])
        maps[dom] = mapping.build_mapping(counts[dom], min(st.cfg.draft_vocab_size, counts[dom].vocab_size))
        mapping.save_mapping(st.work / f"mapping-{dom}.safetensors", maps[dom])
    cmp_doc = mapping_compare.compare_mappings(maps["a"], maps["b"])
    cm = mapping_compare.comparison_metrics(cmp_doc)
    for dom in ("a", "b"):
        cm[f"coverage_of_{dom}_data"] = {
            f"mapping_{m}_pct": round(100 * mapping_compare.coverage(maps[m], counts[dom]), 4) for m in ("a", "b")}
    size = maps["a"].draft_vocab_size
    st.story.doc["mappings"] = {"draft_vocab_size": size, "metrics": cm, "explanation": cmp_doc["explanation"],
                                "env": st.env,
                                "config": {"a": "loss-masked tokens of domain A's data",
                                           "b": "loss-masked tokens of domain B's data",
                                           "draft_vocab_size": size, "model": str(st.cfg.model)}}
    st.say(f"mappings: {cmp_doc['explanation']}; coverage of B data: A {cm['coverage_of_b_data']['mapping_a_pct']}%, "
           f"B {cm['coverage_of_b_data']['mapping_b_pct']}%")
    st.story.stage("mappings", time.perf_counter() - t0)
