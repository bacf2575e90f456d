"""The fused tree's bookkeeping (index tables, masks built from slot one-hots, parent rows from entry tables, the
children by ``top_children``'s rounds of max) against the named ``Drafting.tree`` (on the CPU, ``top_children``'s topk
path) over a stub drafter whose logits are full of exact ties: the same drafter inputs (ids, hidden, positions, slots,
masks) call by call, the same tree, the padding rows as before. And the device operations a fused cycle issues,
counted with a dispatch mode: per program (drafter and target excluded) and around the programs, where a steady cycle
issues one (the read of ``meta``) and copies nothing into the programs' inputs."""

from __future__ import annotations

import contextlib
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers.models import VOCAB, tiny_causal_lm, tiny_drafter, tiny_llama_config

from eaglekb.engine.cuda_graphs import _Captured
from eaglekb.engine.draft import DraftModel, Drafting
from eaglekb.engine.fused import FusedTree
from eaglekb.engine.generate import Engine, SpecConfig
from eaglekb.engine.model import TargetModel
from eaglekb.models.target import default_capture_points

VD, H, W, M = 48, 6, 64, 97  # draft vocab, hidden size, drafter cache width, table rows


class StubDrafter:
    """Logits and hidden looked up from fixed tables by each row's (token, position, incoming hidden): a pure function
    of the inputs, so the fused and the named calls get the same rows; ``levels`` distinct logit values make ties."""

    def __init__(self, levels: int | None, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.logits = torch.randn(M, VD, generator=g) if levels is None else \
            torch.randint(0, levels, (M, VD), generator=g).float()
        self.hid = torch.randint(-3, 4, (M, H), generator=g).float()
        self.d2t = torch.randint(0, 5, (VD,), generator=g) * 2
        self.device = torch.device("cpu")
        self.calls = []

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def step(self, ids, hidden, positions, slots, mask):
        """``Drafting``'s drafter call: ``ids [1,T]``, ``hidden [1,T,*]``."""
        self.calls.append((ids[0].clone(), hidden[0].sum(-1), positions.clone(), slots.clone(), mask.clone()))
        key = (ids[0] * 31 + positions * 7 + hidden[0].sum(-1).long()) % M
        return self.logits[key][None], self.hid[key][None]

    def __call__(self, ids, hidden, positions, slots, mask, kv, *, compiled=False):
        return self.step(ids, hidden[..., :H], positions, slots, mask)


def _engine(dm, pad: int):
    return SimpleNamespace(device=torch.device("cpu"), drafter=dm, dkv=SimpleNamespace(max_len=W), max_len=W,
                           graphs=False, compiled=False, pad_rows=lambda n: max(n, 2) + pad)


@pytest.mark.parametrize("levels", [2, 5, None], ids=["ties2", "ties5", "noties"])
@pytest.mark.parametrize("key", [(4, 4, 16), (3, 2, 7), (5, 4, 3), (4, 3, 8), (1, 3, 4), (2, 3, 13), (6, 2, 9)],
                         ids=lambda k: "s{}k{}n{}".format(*k))
def test_fused_tree_is_the_named_tree_with_ties(levels, key):
    steps, topk, budget = key
    for seed in range(3):
        dm = StubDrafter(levels, seed)
        fc = FusedTree(_engine(dm, pad=seed), steps, topk, budget)
        start, toks = 11 + seed, [5 + seed, 9, 17][:1 + seed % 3]
        n, rows = len(toks), fc.rows
        fc.meta.copy_(torch.tensor([n - 1, start + n, *range(start, start + rows), *toks,
                                    *toks[-1:] * (rows - n + fc.roots)]))
        aux = torch.randint(-2, 3, (rows, 3 * H), generator=torch.Generator().manual_seed(seed)).float()
        vids, depth, prow, slots = fc._draft(fc.meta, aux)
        extend, *fused = dm.calls
        dm.calls = []
        logits, hidden = dm.step(extend[0][None], aux[None, :, :H], extend[2], extend[3], extend[4])
        tree = Drafting(dm, dm.step, static_width=W).tree(logits[0, n - 1], hidden[0, n - 1], root_pos=start + n - 1,
                                                          scratch=start + n, steps=steps, topk=topk, budget=budget)
        named = dm.calls[1:]
        assert slots.tolist() == list(range(start + n, start + n + len(slots)))  # the verify rows' slots, from base
        assert len(fused) == len(named) == steps - 1
        for got, want in zip(fused, named):  # the frontier passes: ids, hidden, positions, slots, masks
            assert all(torch.equal(a, b) for a, b in zip(got, want))
        k = fc.nodes
        assert vids[1:k + 1].tolist() == tree.tokens and (prow[1:k + 1] - 1).tolist() == tree.parents
        assert depth[1:k + 1].tolist() == tree.depths
        assert vids[0] == toks[-1] and depth[0] == 0 and prow[0] == 0
        pads = fc.vrows - k - 1  # padding rows: the root token at depth 0, each its own parent
        assert vids[k + 1:].tolist() == [toks[-1]] * pads and depth[k + 1:].tolist() == [0] * pads
        assert prow[k + 1:].tolist() == list(range(k + 1, fc.vrows))


class OpCount(TorchDispatchMode):
    """Device operations by phase: aten ops that are neither views nor bare allocations, none inside ``quiet()``."""

    SKIP = {"empty", "empty_like", "new_empty", "empty_strided", "detach", "lift_fresh"}

    def __init__(self):
        super().__init__()
        self.phase, self.off, self.ops = "outside", 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.off and not func.is_view and func.overloadpacket.__name__ not in self.SKIP:
            self.ops.append((self.phase, func.overloadpacket.__name__))
        return out

    @contextlib.contextmanager
    def quiet(self):
        self.off += 1
        try:
            yield
        finally:
            self.off -= 1

    @contextlib.contextmanager
    def within(self, phase: str):
        before, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = before


class Quiet:
    """A model whose forward is not counted (the drafter's and the target's own operations)."""

    def __init__(self, model, count: OpCount):
        self.model, self.count = model, count

    def __call__(self, *args, **kw):
        with self.count.quiet():
            return self.model(*args, **kw)

    def __getattr__(self, name):
        return getattr(self.model, name)


def _counted(count: OpCount, spec: SpecConfig, *, fake_graphs: bool = False):
    """A tiny engine whose fused tree for ``spec`` counts each program call and each cycle as a phase of its own
    (``draft <i>``, ``verify <i>``, ``cycle <i>``: the ops around the programs)."""
    cfg = tiny_llama_config(max_position_embeddings=160)
    tm = TargetModel(tiny_causal_lm(cfg), default_capture_points(cfg.num_hidden_layers), 160)
    eng = Engine(tm, DraftModel(tiny_drafter(cfg), tm), fused=True)
    eng.target, eng.drafter = Quiet(eng.target, count), Quiet(eng.drafter, count)
    fc = eng._fused[(spec.steps, spec.topk, spec.draft_tokens)] = FusedTree(eng, spec.steps, spec.topk,
                                                                             spec.draft_tokens)
    calls = Counter()

    def phase(name, fn):
        def run(*args):
            calls[name] += 1
            with count.within(f"{name} {calls[name]}"):
                return fn(*args)
        return run

    fc.draft.fn, fc.verify.fn, fc.cycle = phase("draft", fc._draft), phase("verify", fc._verify), phase("cycle",
                                                                                                         fc.cycle)
    if fake_graphs:
        for graphed in (fc.draft, fc.verify):
            _fake_graph(graphed, count)
    return eng, fc


def _fake_graph(graphed, count: OpCount) -> None:
    """``graphed`` served as a captured graph on the CPU: its calls copy inputs as on CUDA; a replay runs the function
    again, uncounted (it is the program, counted by its own phase in the capture), into the captured outputs."""
    graphed.enabled = True

    def capture(args):
        static = list(args) if graphed.static_inputs else [a.clone() for a in args]
        out = graphed.fn(*static)

        def replay():
            with count.quiet():
                for o, new in zip(out, graphed.fn(*static)):
                    o.copy_(new)
        return _Captured(SimpleNamespace(replay=replay), static, out)

    graphed._capture = capture


def _by_phase(count: OpCount, kind: str) -> dict[int, Counter]:
    out: dict[int, Counter] = {}
    for phase, op in count.ops:
        name, _, i = phase.partition(" ")
        if name == kind:
            out.setdefault(int(i), Counter())[op] += 1
    return out


def test_the_tree_programs_device_operations():
    """(4, 4, 16), the bench's tree: the draft program issues 67 device ops besides the drafter's (46 before: each of
    its 4 ``topk`` over the draft vocab, a 46 us radix select on the H200 for 4 rows, is now 4 small max reductions and
    3 maskings; its other bookkeeping went from 38 to 35 ops), the verify program 62 besides the target's (78)."""
    count = OpCount()
    spec = SpecConfig(steps=4, topk=4, draft_tokens=16)
    eng, fc = _counted(count, spec)
    prompt = list(range(5, 16))
    with count:
        got = eng.speculative(prompt, 60, spec)
    assert got.tokens == Engine(eng.target.model).generate(prompt, 60).tokens
    drafts, verifies = _by_phase(count, "draft"), _by_phase(count, "verify")
    assert len(drafts) == len(verifies) + 1 == got.cycles  # the first cycle is the named steps'; one spare draft
    vocab_wide = Counter({"_log_softmax": 4, "max": 16, "scatter_": 12})  # top_children: 1 + k + (k - 1) per call
    for ops in drafts.values():
        assert sum(ops.values()) == 67 and "topk" not in ops and "_local_scalar_dense" not in ops
        assert ops & vocab_wide == vocab_wide and ops["sort"] == 3  # two frontiers, the kept candidates
        assert sum((ops - vocab_wide).values()) == 35
    for ops in verifies.values():
        assert sum(ops.values()) == 62 and "_local_scalar_dense" not in ops


def test_a_steady_cycle_issues_one_op_around_its_programs():
    """Graphed as on CUDA (fake replays on the CPU): around its two programs a steady cycle issues the read of ``meta``
    and nothing else: no copy from the host, no copy into a graph's inputs (the draft reads ``meta`` and the aux rows
    where the verify wrote them, the verify reads the draft's outputs; before, 1 + 2 + 4 copies a cycle besides the
    read). Another tensor passed in is still copied into the graph's input. The tokens are plain greedy's."""
    count = OpCount()
    spec = SpecConfig(steps=4, topk=4, draft_tokens=16)
    eng, fc = _counted(count, spec, fake_graphs=True)
    prompt = list(range(5, 16))
    with count:
        got = eng.speculative(prompt, 60, spec)
        other = fc.meta.clone()
        with count.within("again"):
            fc.draft(other, fc.aux)
    assert got.tokens == Engine(eng.target.model).generate(prompt, 60).tokens
    cycles = _by_phase(count, "cycle")
    first, *steady = (cycles[i] for i in sorted(cycles))
    assert len(steady) > 5 and len(fc.draft.graphs) == len(fc.verify.graphs) == 1
    assert first == Counter({"copy_": 2, "cat": 1})  # a generation's first: meta in, aux in (padded), meta out
    for ops in steady:
        assert ops == Counter({"copy_": 1})
    assert Counter(op for phase, op in count.ops if phase == "again") == Counter({"copy_": 1})


def test_profile_classes_name_a_top_k_apart_from_gathers():
    from eaglekb.engine.profile import kernel_kind

    assert kernel_kind("void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(...)") == "topk_sort"
    assert kernel_kind("void at::native::bitonicSortKVInPlace<2, -1, 16, 16, float, long>(...)") == "topk_sort"
    assert kernel_kind("void at::native::index_elementwise_kernel<128, 4>(...)") == "copy_index"
    assert kernel_kind("void at::native::vectorized_gather_kernel<16, long>(...)") == "copy_index"
