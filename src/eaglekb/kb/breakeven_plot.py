"""The plot of a break-even curve record (``invoke plan.curve``): predicted speedup against the target's plain step.

Owns one SVG: for each accept length the record priced, the speedup the cycle model predicts (``speedup = A * P /
(verify_x * P + fixed)``, the fixed part's fitted range shaded), break-even (speedup 1) and the plain step from which
each accept length pays, the measured sets the fit came from, and the anchors the record names. Everything drawn
comes from the record's own metrics and config; the arithmetic is ``eaglekb.measure.breakeven_curve``'s.
``plan_svg`` picks this plot or the viability plot for a plan record. Knows nothing about the docs tool.
"""

from __future__ import annotations

from eaglekb.io.errors import DocsError
from eaglekb.kb import render
from eaglekb.kb.schema import Baseline
from eaglekb.measure.breakeven_curve import key_of, pays_from_ms, speedup_x

MARKERS = ("o", "s", "D", "^", "v", "P", "X")
TICKS = (0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500)


def is_curve(baseline: Baseline) -> bool:
    """Whether a plan record is a break-even curve (its fitted fixed part and priced plain steps)."""
    return baseline.kind == "plan" and "fixed_ms" in baseline.metrics and "plain" in baseline.metrics


def plan_svg(baseline: Baseline) -> str:
    """The default plot of a plan record: the curve for a break-even curve, else the viability curves."""
    return curve_svg(baseline) if is_curve(baseline) else render.viability_svg(baseline)


def _grid(lo: float, hi: float, n: int = 120) -> list[float]:
    return [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)]


def _points(baseline: Baseline, group: str) -> list[tuple[str, float, float]]:
    """(label, plain step ms, speedup) of each measured set (``sets``) or anchor (``anchors``) with both."""
    out = []
    for key, node in (baseline.metrics.get(group) or {}).items():
        speed = node.get("measured_speedup_x", node.get("speedup_x")) if isinstance(node, dict) else None
        if isinstance(speed, (int, float)):
            out.append((key, float(node["plain_step_ms"]), float(speed)))
    return out


def curve_svg(baseline: Baseline) -> str:
    """Predicted speedup against plain step for each accept length, break-even marked, measured points and anchors."""
    m, cfg = baseline.metrics, baseline.config
    fixed, lo, hi = (float(m[k]) for k in ("fixed_ms", "fixed_min_ms", "fixed_max_ms"))
    vx = float(cfg.get("verify_x", 1.0))
    accepts = [float(a) for a in cfg.get("accept_lens") or []]
    if not accepts:
        raise DocsError("no accept lengths to draw", where=baseline.id, expected="config.accept_lens", found="none")
    sets, anchors = _points(baseline, "sets"), _points(baseline, "anchors")
    xs_all = [p for _, p, _ in sets + anchors] + [float(p) for p in cfg.get("plain_ms") or []]
    xs = _grid(max(0.5, min(xs_all) / 1.5), max(50.0, max(xs_all) * 1.5))
    plt = render._pyplot()
    fig, ax = plt.subplots(figsize=(7.2, 4.4))
    for a in accepts:
        (line,) = ax.plot(xs, [speedup_x(p, a, fixed, vx) for p in xs], linewidth=1.5, label=f"accept {a:g}")
        ax.fill_between(xs, [speedup_x(p, a, hi, vx) for p in xs], [speedup_x(p, a, lo, vx) for p in xs],
                        color=line.get_color(), alpha=0.10, linewidth=0)
        start = pays_from_ms(a, fixed, vx)
        if start is not None and a in (2.5, 3.0):
            ax.axvline(start, color=line.get_color(), linestyle=":", linewidth=1)
            ax.annotate(f"accept {a:g} pays from {start:.2f} ms", (start, 3.9), color=line.get_color(),
                        fontsize=7, rotation=90, ha="right", va="top")
    ax.axhline(1.0, color="red", linewidth=1)
    ax.annotate("break-even (speedup 1)", (xs[-1], 1.0), color="red", ha="right", va="bottom", fontsize=8)
    if sets:
        ax.scatter([p for _, p, _ in sets], [s for _, _, s in sets], marker="x", color="black", zorder=5,
                   label="measured sets of the fit")
    ids = {key_of(i.split("/")[-1]): i for i in cfg.get("anchors") or []}
    for n, (key, p, s) in enumerate(anchors):
        ax.scatter([p], [s], marker=MARKERS[n % len(MARKERS)], color="dimgray", zorder=5,
                   label=ids.get(key, key))
    ax.set_xscale("log")
    ticks = [t for t in TICKS if xs[0] <= t <= xs[-1]]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
    ax.set_xlabel("target's plain decode step at batch 1 (ms)")
    ax.set_ylabel("EAGLE-3 speedup over plain (x)")
    ax.set_ylim(0, max(4.0, *(s * 1.1 for _, _, s in sets + anchors)))
    ax.set_title(f"{baseline.id}: predicted, cycle = {vx:g} x step + {fixed:.2f} ms")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return render._svg(fig)
