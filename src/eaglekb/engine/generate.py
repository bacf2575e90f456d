"""The decoding loops: plain greedy/sampled decoding and EAGLE-3 speculative decoding.

Owns: ``SpecConfig`` (steps, topk, draft-token budget, temperature), ``Engine``
(a target, an optional drafter, their static caches, allocated once) and the
named steps of a cycle, gpt-fast style (greedy cycles after the first run as the
two device programs of ``eaglekb.engine.fused`` instead when fusing is on):

``prefill`` -> ``draft`` (drafter extend over newly verified positions, then a
chain or tree) -> ``verify`` (one target pass over root + tree with a tree mask)
-> ``accept`` (greedy or sampled rule from ``verify``) -> ``commit`` (keep the
accepted path's K/V in place, queue its aux hidden states for the drafter).

Cache layout: target slot = sequence position for committed tokens; the tree is
written after them and the accepted path moved down. The drafter's slot j holds
drafter position j (aux[j] with token j+1); tree drafts use scratch slots after
the verified prefix. Everything is overwritten, nothing reallocated.

Knows nothing about prompts sets, baselines or the task runner.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator

import torch

from eaglekb.engine import verify as V
from eaglekb.engine.cpu_packed import draft_setup as cpu_draft_setup, setup as cpu_packed_setup, \
    target_step as cpu_packed_step
from eaglekb.engine.cuda_graphs import Graphed
from eaglekb.engine.loop import DecodeLoop
from eaglekb.engine.draft import DraftModel, Drafting, DraftTree
from eaglekb.engine.fused import FusedChain, FusedTree
from eaglekb.engine.kv import causal_rows, mask_width, tree_rows
from eaglekb.engine.model import TargetModel
from eaglekb.engine.parallel import check_spec, parallel_chain
from eaglekb.engine.timing import PhaseTimer
from eaglekb.models.layers import CPU_FEW_ROWS, calibrate_cpu_products
from eaglekb.io.errors import BadInput


ROW_BUCKETS = (4, 8, 16, 32, 64)
#: CPU threads for decode, draft and verify steps (see ``Engine._steps``); None keeps torch's setting.
CPU_STEP_THREADS = 1


@dataclass
class SpecConfig:
    """Speculation settings, SGLang's names: steps, topk, draft tokens (root included)."""

    steps: int = 3
    topk: int = 1
    draft_tokens: int | None = None  # None: steps + 1 for a chain, else 1 + topk * steps
    temperature: float = 0.0
    # a chain stops drafting after a token whose draft probability is below this (0: always ``steps`` tokens)
    min_draft_prob: float = 0.0

    def __post_init__(self):
        for name, low in (("steps", 1), ("topk", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise BadInput(f"{name} must be a whole number >= {low}", where=f"--{name}", found=repr(v))
        if self.draft_tokens is None:
            self.draft_tokens = self.steps + 1 if self.topk == 1 else 1 + self.topk * self.steps
        if self.draft_tokens < 2:
            raise BadInput("draft-token budget too small", where="--draft-tokens", expected=">= 2",
                           found=str(self.draft_tokens))
        if self.topk == 1 and self.draft_tokens != self.steps + 1:
            raise BadInput("with topk 1 the draft tokens are steps + 1", where="--draft-tokens",
                           expected=str(self.steps + 1), found=str(self.draft_tokens))
        if self.topk > 1 and self.draft_tokens > 1 + self.topk + (self.steps - 1) * self.topk ** 2:
            raise BadInput("draft-token budget exceeds the tree", where="--draft-tokens",
                           expected=f"<= {1 + self.topk + (self.steps - 1) * self.topk ** 2}",
                           found=str(self.draft_tokens))
        if self.temperature < 0:
            raise BadInput("temperature must be >= 0", where="--temperature", found=str(self.temperature))
        p = self.min_draft_prob
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1:
            raise BadInput("draft probability out of range", where="--min-draft-prob", expected="0 <= p < 1",
                           found=repr(p))
        if p > 0 and self.topk > 1:
            raise BadInput("a draft-probability stop ends chains; a tree keeps its draft-token budget",
                           where="--min-draft-prob", expected="--topk 1 (or --min-draft-prob 0)",
                           found=f"--topk {self.topk}")

    @property
    def nodes(self) -> int:
        return self.draft_tokens - 1


def _trim_last_cycle(result: "GenResult", cut: int) -> None:
    """The last cycle's tokens past the end (``max_new_tokens`` or a stop token) are not output: its accept length
    and depth counts keep only the tokens kept, so accept lengths count output tokens (SGLang's
    ``completion_tokens / spec_verify_ct``), not drafts accepted past a prompt's end."""
    if cut <= 0 or not result.accept_lens:
        return
    length = result.accept_lens[-1]
    kept = max(length - cut, 1)  # the loop stops at the cycle that reaches the end: it keeps at least one token
    result.accept_lens[-1] = kept
    for d in range(kept, length - 1):  # drafts at depth d+1 that fell past the end
        result.accepted_per_depth[d] -= 1


@dataclass
class GenResult:
    """One generation: new tokens, per-cycle accept lengths (bonus included) and phase times."""

    tokens: list[int]
    prompt_len: int
    accept_lens: list[int] = field(default_factory=list)
    accepted_per_depth: list[int] = field(default_factory=list)  # cycles whose depth-d draft was accepted
    drafted: int = 0  # draft tokens verified, all cycles
    times: dict[str, float] = field(default_factory=dict)  # seconds per phase

    @property
    def cycles(self) -> int:
        return len(self.accept_lens)

    @property
    def accept_len(self) -> float:
        return sum(self.accept_lens) / len(self.accept_lens) if self.accept_lens else float("nan")


class Engine:
    """A target (and optionally a drafter) with static caches sized ``max_len``.

    ``cpu_packed`` (CPU only): ``auto`` times the target step on packed weight copies per row count and keeps
    them where faster, within a memory guard; ``on`` packs every row count; ``off`` none
    (``eaglekb.engine.cpu_packed``). ``cpu_draft_fp16`` (CPU only): ``auto`` and ``on`` run the drafter's products
    on half-width copies of the matrices float16 holds exactly (``on`` refuses where one would round), ``off``
    in float32 over the float32 matrices. ``cpu_draft_int8`` (CPU only): ``auto`` and ``on`` run most of the
    drafter's products on int8 copies instead (``eaglekb.engine.cpu_packed.DRAFT_INT8``; lossy: acceptance may fall,
    the tokens kept never change), ``off`` (the default) none. ``cpu_target_fp16`` (CPU only): the target's half-width copies, one more
    product for the same per-row-count timing (``auto``); ``on`` runs every row count on them, ``off`` makes none.
    ``progress``: a bar while that timing runs (seconds on a real model)."""

    GRAPHED_EXTEND = 16  # drafter extends up to this many positions run through Graphed (CUDA graphs)

    def __init__(self, target: TargetModel, drafter: DraftModel | None = None, *, max_len: int | None = None,
                 graphs: bool = False, compile: bool | None = None, max_nodes: int = 64, seed: int = 0,
                 step_threads: int | None = CPU_STEP_THREADS, fused: bool | None = None, cpu_packed: str = "auto",
                 cpu_draft_fp16: str = "auto", cpu_target_fp16: str = "auto", cpu_draft_int8: str = "off",
                 progress: bool = False):
        self.target, self.drafter = target, drafter
        self.step_threads = step_threads
        self.device = target.device
        self.max_len = max_len or target.max_len
        if self.max_len > target.max_len:
            raise BadInput("cache longer than the rope table", where="max_len",
                           expected=f"<= {target.max_len}", found=str(self.max_len))
        self.graphs = bool(graphs) and self.device.type == "cuda"
        # inductor-compiled layers inside the graphs (fixed shapes only); default: on with graphs
        self.compiled = self.graphs if compile is None else bool(compile)
        # greedy chains and trees as two device programs per cycle (``FusedChain``, ``FusedTree``); default: on
        # with graphs; keyed by (steps, topk, draft tokens)
        self.fused = self.graphs if fused is None else bool(fused)
        if drafter is not None and drafter.parallel_tokens:  # P-EAGLE drafts on the named steps (engine.parallel)
            if fused:
                raise BadInput("fused cycles draft EAGLE-3 chains and trees only", where="--fused",
                               expected="auto or off with a P-EAGLE drafter", found="on")
            self.fused = False
        self._fused: dict[tuple[int, int, int], FusedChain | FusedTree] = {}
        if self.compiled:
            target.compile()
            if drafter is not None:
                drafter.compile()
        self.tkv = target.new_cache(self.max_len)
        self.dkv = drafter.new_cache(self.max_len + max_nodes) if drafter is not None else None
        self.max_nodes = max_nodes
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        c = self.compiled
        self._target_step = Graphed(lambda ids, pos, slots, mask: target(ids, pos, slots, mask, self.tkv, compiled=c),
                                    enabled=self.graphs)
        self._loop = DecodeLoop(self) if self.graphs else None
        # CPU: the faster product for a step's few rows, timed on this model's own matrices (once per process),
        # then, per row count, packed weight copies where the whole target step runs faster on them
        self.cpu_products, self.cpu_packed, self.cpu_draft = None, None, None
        if self.device.type == "cpu":
            if drafter is not None:
                self.cpu_draft = cpu_draft_setup(drafter, cpu_draft_fp16, int8=cpu_draft_int8, compiled=self.compiled)
            with self._steps():
                self.cpu_products = calibrate_cpu_products(
                    [target.layers[0].wgu, target.layers[0].down, target.layers[0].wqkv, target.lm_head])
                self.cpu_packed = cpu_packed_setup(target, cpu_packed, cpu_packed_step(self), fp16=cpu_target_fp16,
                                                   compiled=self.compiled, progress=progress)
            p = self.cpu_packed
            self.cpu_products = dict(self.cpu_products, **{str(r): "packed" for r in p.rows},
                                     **{str(r): "fp16" for r in p.fp16_rows})
        else:
            for flag, mode, free in (("--cpu-packed", cpu_packed, "auto"), ("--cpu-draft-fp16", cpu_draft_fp16, "auto"),
                                     ("--cpu-target-fp16", cpu_target_fp16, "auto"),
                                     ("--cpu-draft-int8", cpu_draft_int8, "auto or off")):
                if mode not in free.split(" or "):  # the default, or auto: nothing to do off the CPU
                    raise BadInput("packed weight copies are for the CPU engine", where=flag,
                                   expected=f"{free} with --device {self.device.type}", found=repr(mode))
        if drafter is not None:
            self._draft_step = Graphed(lambda ids, h, pos, slots, mask: drafter(ids, h, pos, slots, mask, self.dkv,
                                                                                 compiled=c),
                                       enabled=self.graphs)
            self.drafting = Drafting(drafter, self._draft_step, static_width=self.dkv.max_len if self.graphs else 0,
                                     cache_len=self.dkv.max_len)

    @contextlib.contextmanager
    def _steps(self) -> Iterator[None]:
        """Decode / draft / verify steps on CPU run on ``step_threads`` threads (prefill keeps torch's default).

        Measured on the 2-core CPU machine (smollm2-135m fp32): one thread is as fast as two for these
        memory-bound steps on a quiet machine, and with one other busy process two OpenMP threads made a
        1-token step 2.4x and a 4-token verify 3-4x slower (threads wait at barriers for a descheduled
        peer) while one thread slowed by a few percent: plain and speculative decoding now degrade alike. On
        another 2-core host two threads streamed the weights about twice as fast on a quiet machine
        (``invoke bench --cpu-step-threads 2``); one stays the default for its behaviour under load."""
        if self.device.type != "cpu" or not self.step_threads:
            yield
            return
        before = torch.get_num_threads()
        torch.set_num_threads(min(self.step_threads, before))
        try:
            yield
        finally:
            torch.set_num_threads(before)

    def seed(self, seed: int) -> None:
        self.gen.manual_seed(seed)

    @property
    def capture_s(self) -> float:
        total = self._target_step.capture_s + (self._loop.capture_s if self._loop is not None else 0.0)
        total += sum(f.capture_s for f in self._fused.values())
        return total + (self._draft_step.capture_s if self.drafter is not None else 0.0)

    # ------------------------------------------------------------------ checks

    def pad_rows(self, n: int) -> int:
        """Query rows to run for ``n`` tokens.

        CPU: up to 7 rows run as they are (``eaglekb.models.layers.linear`` streams the weights
        faster for 2-5 rows than through ``F.linear``; 6-7 still beat 8); more are padded to a
        multiple of 4. CUDA graphs: every row count is a captured graph and, compiled, an inductor
        compile, so counts are rounded up to one of ``ROW_BUCKETS`` (a few extra rows cost nothing
        on a launch-bound GPU step)."""
        if n < 2:
            return n
        if self.device.type == "cpu":
            return n if n <= CPU_FEW_ROWS[1] else -(-n // 4) * 4
        if self.graphs:
            return next((b for b in ROW_BUCKETS if b >= n), n)
        return n

    def check_fits(self, prompt_len: int, max_new_tokens: int, nodes: int = 0, frontier: int = 0) -> None:
        """Refuse a prompt, budget or tree that does not fit the caches; ``frontier``: a tree's scratch slots."""
        need = prompt_len + max_new_tokens + (self.pad_rows(nodes + 1) if nodes else 1)
        if prompt_len < 1:
            raise BadInput("empty prompt", where="prompt", expected=">= 1 token", found="0")
        if need > self.max_len:
            raise BadInput("prompt longer than the cache", where="prompt",
                           expected=f"prompt + new tokens + draft tokens <= {self.max_len - 1}",
                           found=f"{prompt_len} + {max_new_tokens} + {nodes}",
                           fix="shorten the prompt, lower --max-new-tokens or raise the cache size")
        if nodes > self.max_nodes:
            raise BadInput("draft-token budget larger than the drafter scratch", where="--draft-tokens",
                           expected=f"<= {self.max_nodes + 1}", found=str(nodes + 1))
        if frontier > self.max_nodes:
            raise BadInput("tree frontier larger than the drafter scratch", where="--steps/--topk",
                           expected=f"(steps - 1) x topk <= {self.max_nodes}", found=str(frontier))

    def _ids(self, prompt) -> torch.Tensor:
        ids = torch.as_tensor(prompt, dtype=torch.long, device=self.device).view(1, -1)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.target.vocab):
            raise BadInput("token id out of range", where="prompt",
                           expected=f"[0, {self.target.vocab - 1}]", found=f"[{int(ids.min())}, {int(ids.max())}]")
        return ids

    def _width(self, needed: int) -> int:
        return mask_width(needed, self.max_len, static=self.graphs, device=self.device)

    def _pick(self, logits: torch.Tensor, temperature: float) -> int:
        if temperature <= 0:
            return int(logits.argmax(-1))
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        return int(torch.multinomial(probs, 1, generator=self.gen))

    # ------------------------------------------------------------------ named steps

    def prefill(self, ids: torch.Tensor):
        """Target over the prompt: logits of the last position and aux states of every position."""
        n = ids.shape[1]
        ar = torch.arange(n, device=self.device)
        mask = causal_rows(0, n, self._width(n), self.device)
        return self.target(ids, ar, ar, mask, self.tkv, last_only=True)

    def decode_one(self, token: int, pos: int):
        """Target over one token at ``pos`` (static shapes: graphable)."""
        dev = self.device
        mask = causal_rows(pos, 1, self._width(pos + 1), dev)
        return self._target_step(torch.tensor([[token]], device=dev), torch.tensor([pos], device=dev),
                                 torch.tensor([pos], device=dev), mask)

    def draft_extend(self, tokens: list[int], aux: torch.Tensor, start: int):
        """Drafter over verified positions ``start..start+n-1``: aux[j] with token j+1 (``tokens``); returns logits
        ``[1,n,Vd]`` and hidden ``[1,n,H]``. On the CPU the logits are the last row's alone, ``[1,1,Vd]``: all a cycle
        drafts from, and the rest of a prompt's would cost a product over the whole draft vocab per row."""
        dev = self.device
        n = len(tokens)
        cpu = dev.type == "cpu"
        if n <= self.GRAPHED_EXTEND:  # cycle extends (accepted + bonus): few shapes, graphable
            rows = self.pad_rows(max(n, 2) if self.graphs else n)  # padding rows after the real ones; drafting
            # overwrites their slots before any step reads them
            ar = torch.arange(start, start + rows, device=dev)
            width = mask_width(start + rows, self.dkv.max_len, static=self.graphs, device=dev)
            ids = torch.tensor([tokens + tokens[-1:] * (rows - n)], device=dev)
            if rows > n:
                aux = torch.cat([aux, aux[-1:].expand(rows - n, -1)])
            mask = causal_rows(start, rows, width, dev)
            if cpu:  # no graphs: the drafter itself, the last real row's logits alone
                logits, hidden = self.drafter(ids, aux.view(1, rows, -1), ar, ar, mask, self.dkv,
                                              compiled=self.compiled, logits_at=n - 1)
                return logits, hidden[:, :n]
            logits, hidden = self._draft_step(ids, aux.view(1, rows, -1), ar, ar, mask)
            return logits[:, :n], hidden[:, :n]
        ar = torch.arange(start, start + n, device=dev)
        mask = causal_rows(start, n, mask_width(start + n, self.dkv.max_len, static=self.graphs, device=dev), dev)
        ids = torch.tensor([tokens], device=dev)
        # the prompt: eager
        return self.drafter(ids, aux.view(1, n, -1), ar, ar, mask, self.dkv, logits_at=n - 1 if cpu else None)

    def draft(self, root_logits, root_hidden, m: int, cfg: SpecConfig) -> DraftTree:
        if cfg.topk == 1:
            return self.drafting.chain(root_logits, root_hidden, root_pos=m - 2, scratch=m - 1, steps=cfg.steps,
                                       temperature=cfg.temperature, gen=self.gen, min_prob=cfg.min_draft_prob)
        return self.drafting.tree(root_logits, root_hidden, root_pos=m - 2, scratch=m - 1, steps=cfg.steps,
                                  topk=cfg.topk, budget=cfg.draft_tokens)

    def verify(self, root: int, tree: DraftTree, m: int):
        """Target over ``[root] + tree`` at slots ``m-1 ..``; returns logits ``[N+1,V]`` and aux ``[N+1,3H]``."""
        dev = self.device
        base = m - 1
        n = len(tree) + 1
        pad = self.pad_rows(n) - n  # padding rows: the root again, seeing only the prefix and themselves
        ids = torch.tensor([[root] + tree.tokens + [root] * pad], device=dev)
        pos = torch.tensor([base] + [base + d for d in tree.depths] + [base] * pad, device=dev)
        slots = torch.arange(base, base + n + pad, device=dev)
        mask = tree_rows(base, [-1] + [p + 1 for p in tree.parents] + [-1] * pad, self._width(base + n + pad), dev)
        logits, aux = self._target_step(ids, pos, slots, mask)
        return logits[0, :n], aux[0, :n]

    def accept(self, tree: DraftTree, logits: torch.Tensor, cfg: SpecConfig) -> tuple[list[int], int]:
        if cfg.temperature <= 0:
            return V.greedy(tree, logits)
        if cfg.topk == 1:
            return V.sampled_chain(tree, logits, cfg.temperature, self.drafter.d2t, self.gen)
        return V.sampled_tree(tree, logits, cfg.temperature, self.gen)

    def commit(self, path: list[int], aux: torch.Tensor, m: int) -> torch.Tensor:
        """Move the accepted nodes' K/V next to the prefix; return their aux rows (root first)."""
        rows = [0] + [i + 1 for i in path]
        moved = [(m - 1 + r, m - 1 + j) for j, r in enumerate(rows) if r != j]
        if moved:
            dev = self.device
            self.tkv.move(torch.tensor([s for s, _ in moved], device=dev),
                          torch.tensor([d for _, d in moved], device=dev))
        return aux[torch.tensor(rows, device=self.device)]

    # ------------------------------------------------------------------ loops

    def _cycle(self, seq: list[int], result: GenResult, pending: torch.Tensor, start: int, cfg: SpecConfig,
               timer: PhaseTimer, extended=None) -> tuple[torch.Tensor, int]:
        """One draft -> verify -> accept -> commit cycle; extends ``seq`` and ``result``; returns the next pending.

        ``extended``: the drafter's output over the pending positions when already run (the prompt's, in prefill)."""
        m = len(seq)
        timer.mark("draft")
        if self.drafter.parallel_tokens:  # P-EAGLE: the whole chain from one drafter pass
            tree = self._parallel_draft(seq, pending, start, m, cfg, extended)
        else:
            d_logits, d_hidden = extended or self.draft_extend(seq[start + 1:m], pending, start)
            tree = self.draft(d_logits[0, -1].clone(), d_hidden[0, -1].clone(), m, cfg)
        timer.mark("verify")
        v_logits, v_aux = self.verify(seq[-1], tree, m)
        timer.mark("overhead")
        path, bonus = self.accept(tree, v_logits, cfg)
        pending = self.commit(path, v_aux, m)
        new = [tree.tokens[i] for i in path] + [bonus]
        result.drafted += len(tree)
        for d in range(len(path)):
            result.accepted_per_depth[d] += 1
        result.accept_lens.append(len(new))
        seq += new
        result.tokens += new
        return pending, m - 1

    def _parallel_draft(self, seq: list[int], pending, start: int, m: int, cfg: SpecConfig, extended) -> DraftTree:
        """A P-EAGLE drafter's chain (``eaglekb.engine.parallel``): the pending positions and the mask rows in one
        pass; after the prompt's extend (``extended``) only the mask rows run, after its last anchor's row."""
        if extended is not None:
            return parallel_chain(self.drafter, self.dkv, [], None, m - 1, steps=cfg.steps,
                                  temperature=cfg.temperature, gen=self.gen, root_logits=extended[0][0, -1])
        return parallel_chain(self.drafter, self.dkv, seq[start + 1:m], pending, start, steps=cfg.steps,
                              temperature=cfg.temperature, gen=self.gen)

    def fused_cycle(self, cfg: SpecConfig) -> FusedChain | FusedTree | None:
        """The fused cycle for ``cfg`` (built once per shape), or None where the named steps run (sampling, a
        P-EAGLE drafter, or fusing off)."""
        if not self.fused or cfg.temperature > 0 or self.drafter.parallel_tokens or cfg.min_draft_prob > 0:
            return None
        key = (cfg.steps, cfg.topk, cfg.draft_tokens)
        if key not in self._fused:
            self._fused[key] = FusedChain(self, cfg.steps) if cfg.topk == 1 else \
                FusedTree(self, cfg.steps, cfg.topk, cfg.draft_tokens)
        return self._fused[key]

    def generate(self, prompt, max_new_tokens: int, *, temperature: float = 0.0,
                 stop_ids: tuple[int, ...] = (), timer: PhaseTimer | None = None) -> GenResult:
        """Plain decoding with the engine's own target forward (the baseline)."""
        ids = self._ids(prompt)
        n = ids.shape[1]
        self.check_fits(n, max_new_tokens)
        timer = timer or PhaseTimer(self.device, enabled=False)
        timer.mark("prefill")
        logits, _ = self.prefill(ids)
        out = [self._pick(logits[0, -1], temperature)]
        timer.mark("decode")
        if self._loop is not None and temperature <= 0:
            out = self._loop.run(out[0], n, max_new_tokens, stop_ids)
        else:
            with self._steps():
                while len(out) < max_new_tokens and out[-1] not in stop_ids:
                    logits, _ = self.decode_one(out[-1], n + len(out) - 1)
                    out.append(self._pick(logits[0, -1], temperature))
        timer.stop()
        return GenResult(tokens=out, prompt_len=n, times=timer.totals())

    def speculative(self, prompt, max_new_tokens: int, cfg: SpecConfig | None = None, *,
                    stop_ids: tuple[int, ...] = (), timer: PhaseTimer | None = None) -> GenResult:
        """EAGLE-3: prefill, then draft -> verify -> accept -> commit until enough tokens."""
        if self.drafter is None:
            raise BadInput("speculative decoding needs a drafter", where="Engine", found="none loaded")
        cfg = cfg or SpecConfig()
        if self.drafter.parallel_tokens:
            check_spec(self.drafter.parallel_tokens, cfg.steps, cfg.topk)
            if cfg.min_draft_prob > 0:
                raise BadInput("a P-EAGLE drafter drafts its chain in one pass", where="--min-draft-prob",
                               expected="0 with a P-EAGLE drafter", found=str(cfg.min_draft_prob))
        ids = self._ids(prompt)
        n = ids.shape[1]
        self.check_fits(n, max_new_tokens, cfg.nodes, (cfg.steps - 1) * cfg.topk if cfg.topk > 1 else 0)
        timer = timer or PhaseTimer(self.device, enabled=False)
        timer.mark("prefill")
        logits, aux = self.prefill(ids)
        first = self._pick(logits[0, -1], cfg.temperature)
        seq = ids[0].tolist() + [first]
        result = GenResult(tokens=[first], prompt_len=n, accepted_per_depth=[0] * cfg.steps)
        # the drafter over the prompt belongs to prefill (SGLang's draft extend after the target's prefill): a new
        # prompt length is a new eager shape, whose one-off cost would otherwise land in the first cycle's draft
        extended = self.draft_extend(seq[1:], aux[0], 0)
        pending, start = aux[0], 0
        fused = self.fused_cycle(cfg)
        with self._steps():
            done = first in stop_ids
            while len(result.tokens) < max_new_tokens and not done:
                before = len(result.tokens)
                if fused is not None and extended is None:  # the first cycle consumes the prompt's extend
                    pending, start = fused.cycle(seq, result, pending, start, timer)
                else:
                    pending, start = self._cycle(seq, result, pending, start, cfg, timer, extended)
                extended = None
                done = any(t in stop_ids for t in result.tokens[before:])  # a stop token anywhere in the cycle
        if fused is not None:
            fused.end(timer)  # the draft queued for a next cycle: not a cycle's
        timer.stop()
        toks = result.tokens[:max_new_tokens]
        for i, t in enumerate(toks):
            if t in stop_ids:
                toks = toks[:i + 1]
                break
        _trim_last_cycle(result, len(result.tokens) - len(toks))
        result.tokens = toks
        result.times = timer.totals()
        return result
