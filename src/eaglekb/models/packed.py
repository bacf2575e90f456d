"""Packed copies of a model's weight matrices for few-row products on the CPU.

Owns: one model's packed copies (``PackSet``: each matrix reordered once into oneDNN's blocked layout,
``torch.ops.mkldnn._reorder_linear_weight``) and the row counts that run on them, the lookup ``linear`` makes
(``packed_for``: a copy for this matrix and this row count, or None), the product over a copy
(``packed_linear``, ``torch.ops.mkldnn._linear_pointwise``: the same numbers as ``F.linear`` within float32
rounding), their size, and the memory the machine has available (``available_mib``, ``fits``). Also a model's
half-width copies (``HalfSet``): each matrix that float16 holds exactly after a power-of-two scale (a bfloat16
checkpoint's weights, read into float32) stored once in FBGEMM's packed float16 layout
(``torch.ops.quantized.linear_prepack_fp16``), multiplied by ``half_linear`` in float32 (FBGEMM widens each weight
to float32 and accumulates in float32: the same numbers as ``F.linear`` within float32 rounding, over half the bytes),
at every row count (a drafter's) or at the row counts its ``rows`` names (a target's, chosen like the packed ones).
And a drafter's int8 copies (``Int8Set``): each matrix rounded to int8 per output row and multiplied by FBGEMM's
dynamic int8 linear (``torch.ops.quantized.linear_dynamic``, the activations rounded to 8 bits per call): lossy, a
quarter of the float32 bytes, for a drafter only, in the same registry and through the same ``half_for`` /
``half_linear`` lookup as the half-width copies (a weight is in one set at a time).

Why: on a CPU the BLAS behind ``F.linear`` re-reads a matrix in its row-major layout at every call and takes a
slow path for a handful of rows; oneDNN's matmul over a copy already in its blocked layout streams the weights at
close to the one-row rate for 2 to 16 rows (docs/reference/engine.md, "Few rows on the CPU"). The copies live
beside the originals (which ``F.linear`` keeps running where it is faster, and which the model owns), so memory
grows by the matrices packed; ``fits`` keeps ``auto`` within ``PACK_MEMORY_SHARE`` of the memory available.

Knows nothing about engines, steps or timing: which row counts run packed or half-width is the engine's choice
(``eaglekb.engine.cpu_packed``), made by timing its own target step.
"""

from __future__ import annotations

import math
import os
import warnings
import weakref

import torch

#: ``auto`` makes no copies that would take more than this share of the memory available when they are made.
PACK_MEMORY_SHARE = 0.5
#: The dtypes packed: float32 (measured and tested); other dtypes keep ``linear``'s products.
PACK_DTYPES = (torch.float32,)
#: FBGEMM's dynamic int8 linear rounds the activations to 7 bits rather than 8 (torch's default for x86: the
#: int16 pair sums of CPUs without VNNI cannot overflow).
INT8_REDUCE_RANGE = True

# id(weight) -> (a weak reference to the weight, its packed copy, the PackSet that owns it). Keyed by id and
# checked by identity, so a lookup costs a dict access; an entry goes when its weight or its PackSet goes.
_COPIES: dict[int, tuple[weakref.ref, torch.Tensor, "PackSet"]] = {}
# id(weight) -> (a weak reference to the weight, the product over the copy, its FBGEMM parameters, the power of two
# the weight was scaled by, the HalfSet or Int8Set that owns them): the narrow copies, looked up like ``_COPIES``
_HALVES: dict[int, tuple[weakref.ref, object, object, float, "HalfSet"]] = {}


def supported() -> bool:
    """Whether this torch build has oneDNN's packed linear (CPU builds with mkldnn)."""
    return bool(torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def packable(w: torch.Tensor) -> bool:
    """A CPU matrix of a packed dtype."""
    return w.device.type == "cpu" and w.dim() == 2 and w.dtype in PACK_DTYPES


def copies_mib(weights: list[torch.Tensor]) -> float:
    """Memory the packed copies of ``weights`` take, in MiB (oneDNN's blocked layout pads nothing for these
    shapes: the process grew by this much, within 2%, when 30 layers of smollm2-135m were packed)."""
    return sum(w.numel() * w.element_size() for w in weights if packable(w)) / 2**20


def available_mib() -> float | None:
    """Memory available for new allocations now (``MemAvailable`` of /proc/meminfo, else free pages), in MiB;
    None where neither can be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (ValueError, OSError, AttributeError):
        return None


def fits(mib: float, available: float | None, share: float = PACK_MEMORY_SHARE) -> bool:
    """Whether copies of ``mib`` stay within ``share`` of ``available`` MiB (unknown memory: no)."""
    return available is not None and mib <= share * available


class PackSet:
    """One model's packed copies and the row counts (``rows``) that run on them; ``release`` drops them."""

    def __init__(self, weights: list[torch.Tensor]):
        self.rows: set[int] = set()
        kept = list({id(w): w for w in weights if packable(w)}.values())  # each matrix once, in order
        for w in kept:
            _take(_COPIES, w)
            copy = torch.ops.mkldnn._reorder_linear_weight(w.detach())
            _COPIES[id(w)] = (weakref.ref(w, _forget(id(w))), copy, self)
        self._ids: list[int] = [id(w) for w in kept]
        self.mib = copies_mib(kept)

    def __len__(self) -> int:
        return len(self._ids)

    def release(self) -> None:
        """Drop the copies (their memory goes back) and run no row count packed."""
        _drop(_COPIES, self._ids, self)
        self._ids, self.rows, self.mib = [], set(), 0.0


def release(copies: "PackSet | HalfSet | None") -> None:
    """Drop a model's packed or half-width copies, where it has any."""
    if copies is not None:
        copies.release()


def _take(registry: dict, w: torch.Tensor) -> None:
    """Release the set that holds ``w``'s copy in ``registry``, if any: a weight is in one set at a time."""
    entry = registry.get(id(w))
    if entry is not None:
        release(entry[-1])


def _drop(registry: dict, ids: list[int], owner) -> None:
    """Remove ``owner``'s entries (the last field of each) from ``registry``."""
    for key in ids:
        entry = registry.get(key)
        if entry is not None and entry[-1] is owner:
            del registry[key]


def _forget(key: int, registry: dict = _COPIES):
    def gone(ref) -> None:
        entry = registry.get(key)
        if entry is not None and entry[0] is ref:
            del registry[key]
    return gone


def packed_for(w: torch.Tensor, rows: int) -> torch.Tensor | None:
    """``w``'s packed copy where ``rows`` rows run packed for it; else None (and always while compiling: the
    compiled steps keep ``F.linear``)."""
    if not _COPIES or torch.compiler.is_compiling():
        return None
    entry = _COPIES.get(id(w))
    if entry is None or entry[0]() is not w or rows not in entry[2].rows:
        return None
    return entry[1]


def packed_linear(x: torch.Tensor, copy: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w, b)`` over ``w``'s packed copy (oneDNN's matmul); ``x`` of any leading shape."""
    return torch.ops.mkldnn._linear_pointwise(x, copy, b, "none", [], "")


def half_supported() -> bool:
    """Whether this torch build has FBGEMM's float16-weight linear (x86 CPU builds)."""
    engines = torch.backends.quantized.supported_engines
    return "fbgemm" in engines and hasattr(torch.ops.quantized, "linear_prepack_fp16")


def half_scale(w: torch.Tensor) -> int | None:
    """The power of two ``s`` such that float16 holds every value of ``w * 2**s`` exactly (its largest magnitude
    brought into [2**14, 2**15)); None where there is none (a float32 matrix with more bits than float16 keeps, a
    range wider than float16's, a non-finite value) or ``w`` is not a CPU float32 matrix."""
    found = _half_scaled(w)
    return None if found is None else found[0]


def _half_scaled(w: torch.Tensor) -> tuple[int, torch.Tensor] | None:
    """``half_scale``'s ``s`` with ``w * 2**s`` itself (what the copy is made from), or None."""
    if not packable(w) or not w.numel():
        return None
    top = float(w.abs().max())
    if not math.isfinite(top):
        return None
    s = 15 - math.frexp(top)[1] if top else 0
    scaled = w.detach() * 2.0 ** s  # exact: a power of two
    return (s, scaled) if torch.equal(scaled.half().float(), scaled) else None


class HalfSet:
    """One model's half-width copies: the matrices of ``weights`` that float16 holds exactly after a power-of-two
    scale (``half_scale``); ``kept`` and ``refused`` count them. ``rows``: the row counts that run on them (None:
    every row count). ``release`` drops the copies."""

    def __init__(self, weights: list[torch.Tensor], rows: set[int] | None = None):
        self.rows = rows
        self._ids: list[int] = []
        self.refused = 0
        self.mib = 0.0
        for w in {id(w): w for w in weights}.values():  # each matrix once
            made = self._copy(w)
            if made is None:
                self.refused += 1
                continue
            product, params, scale, mib = made
            _take(_HALVES, w)  # a weight is in one set at a time
            _HALVES[id(w)] = (weakref.ref(w, _forget(id(w), _HALVES)), product, params, scale, self)
            self._ids.append(id(w))
            self.mib += mib

    @staticmethod
    def _copy(w: torch.Tensor):
        """``w``'s copy as (product, its FBGEMM parameters, the output scale, MiB), or None where float16 would
        round it."""
        found = _half_scaled(w)
        if found is None:
            return None
        s, scaled = found
        return _fp16_product, torch.ops.quantized.linear_prepack_fp16(scaled, None), 2.0 ** -s, w.numel() * 2 / 2**20

    @property
    def kept(self) -> int:
        return len(self._ids)

    def release(self) -> None:
        """Drop the copies (``linear`` goes back to the float32 matrices)."""
        _drop(_HALVES, self._ids, self)
        self._ids, self.mib = [], 0.0
        if self.rows is not None:
            self.rows = set()


def half_for(w: torch.Tensor, rows: int):
    """``w``'s half-width copy (parameters, output scale) where its model holds one and runs ``rows`` rows on it;
    else None (and always while compiling)."""
    if not _HALVES or torch.compiler.is_compiling():
        return None
    entry = _HALVES.get(id(w))
    if entry is None or entry[0]() is not w or (entry[-1].rows is not None and rows not in entry[-1].rows):
        return None
    return entry[1:4]


def half_linear(x: torch.Tensor, half, b: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w, b)`` over ``w``'s half-width (or int8) copy (``half_for``): float32 in, float32 out."""
    product, params, scale = half
    y = product(x.contiguous(), params)
    if scale != 1.0:
        y.mul_(scale)  # exact: a power of two
    return y if b is None else y + b


def _fp16_product(x: torch.Tensor, params) -> torch.Tensor:
    return torch.ops.quantized.linear_dynamic_fp16(x, params)


def _int8_product(x: torch.Tensor, params) -> torch.Tensor:
    return torch.ops.quantized.linear_dynamic(x, params, INT8_REDUCE_RANGE)


def int8_supported() -> bool:
    """Whether this torch build has FBGEMM's dynamic int8 linear (x86 CPU builds)."""
    return "fbgemm" in torch.backends.quantized.supported_engines and hasattr(torch.ops.quantized, "linear_dynamic")


class Int8Set(HalfSet):
    """A drafter's int8 copies: each float32 matrix of ``weights`` rounded to int8 per output row (symmetric, the
    row's largest magnitude at 127), multiplied by FBGEMM's dynamic int8 linear (the activations rounded to 8 bits
    per call, int32 accumulation, float32 out). Lossy, so for a drafter only: its proposals may change, never the
    tokens the target's verify keeps. Every row count runs on them; ``refused`` counts the matrices that are not
    CPU float32 ones."""

    def __init__(self, weights: list[torch.Tensor]):
        super().__init__(weights, rows=None)

    @staticmethod
    def _copy(w: torch.Tensor):
        if not packable(w) or not w.numel():
            return None
        scales = (w.detach().abs().amax(dim=1).clamp_min(1e-30) / 127).double()
        with warnings.catch_warnings():  # quantized tensors are deprecated; FBGEMM's prepack still takes one
            warnings.simplefilter("ignore", UserWarning)
            q = torch.quantize_per_channel(w.detach(), scales, torch.zeros(w.shape[0], dtype=torch.long), 0,
                                           torch.qint8)
        return _int8_product, torch.ops.quantized.linear_prepack(q, None), 1.0, w.numel() / 2**20
