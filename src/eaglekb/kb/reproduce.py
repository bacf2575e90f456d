"""Did a run reproduce a recorded baseline? The verdict in two parts.

Owns: how a new result is compared with a recorded one (``compare``), and the rules it uses:
which metrics are timing (``is_timing``: units ``_tok_s``, ``_ms``, ``_s`` and the ratios and
break-even lengths built from them) and which are deterministic (accept lengths, accuracies,
exactness, counts, bytes); how far a metric may move (``allowed_delta``: the recorded tolerance
or spread); and the calibration a run measures on its own machine (``CALIBRATION``: the engine's
plain decode tok/s for a probe or a bench), by which timings are normalised before they are
compared.

Deterministic metrics must match within their own tolerance: a miss there is a real change.
Timing metrics move with the machine, so a timing is scaled by the speed ratio of the two
machines' calibrations first; the verdict then reads "acceptance reproduced; this machine is
1.40x slower" instead of "NOT reproduced" on a busy laptop. A run without a calibration compares
timings as they are and says that it could not normalise them.

A comparison also names the inputs whose content differs (``inputs_differ``: the same path holding
other weights), so that "reproduced" is never read as "the same drafter" when it was not.

Knows nothing about where baselines live (``eaglekb.kb.baselines``) or how they are shown.
"""

from __future__ import annotations

from eaglekb.io.files import flatten
from eaglekb.kb.schema import Baseline, StrictModel, unit_of

#: Units whose values are times or rates: they move with the machine.
TIMING_UNITS = ("_tok_s", "_ms", "_s")
#: Per kind: the metric a run measures on its own machine that scales like its other timings
#: (tokens per second of plain decoding with the same engine, model and prompts).
CALIBRATION: dict[str, str] = {"probe": "baseline_tok_s", "bench": "engine.median_tok_s"}
#: Kinds whose numbers are arithmetic on given inputs or copied from a report: nothing in them is a timing.
FIXED_KINDS = ("plan", "reference")
#: Words that make a deterministic ratio (``_x``) of a drafter against a reference drafter, not of times.
_NOT_TIME_RATIOS = ("reference",)


def is_timing(kind: str, path: str) -> bool:
    """Whether a metric moves with the machine: a time or a rate, a speedup or ratio of times, or a
    break-even length (baseline tok/s x cycle time), in a measured kind."""
    if kind in FIXED_KINDS:
        return False
    leaf = path.rsplit(".", 1)[-1]
    unit = unit_of(leaf)
    if unit in TIMING_UNITS:
        return True
    if unit == "_x":
        return not any(word in path for word in _NOT_TIME_RATIOS)
    return leaf.startswith("breakeven")


def allowed_delta(recorded: Baseline, path: str) -> float:
    """How far a metric may move: the largest of its absolute tolerance, relative tolerance and spread."""
    value = flatten(recorded.metrics)[path]
    return max(
        recorded.noise.tolerance_abs.get(path, 0.0),
        recorded.noise.tolerance_rel * abs(value),
        recorded.noise.spread.get(path, 0.0),
    )


class MetricCheck(StrictModel):
    path: str
    recorded: float
    new: float | None
    delta: float | None
    allowed: float
    within: bool
    timing: bool = False
    #: the new value on the recorded machine's speed (timings with a calibration), else None
    normalised: float | None = None


class Calibration(StrictModel):
    path: str
    recorded: float
    new: float
    #: recorded speed / new speed: 1.4 means this machine is 1.4x slower
    slower_x: float


class Comparison(StrictModel):
    baseline_id: str
    #: the deterministic part reproduced (acceptance, exactness, counts); timings are judged apart
    reproduced: bool
    #: timings within tolerance after normalising (None: the result has no timing metric)
    timing_reproduced: bool | None = None
    calibration: Calibration | None = None
    checks: list[MetricCheck]
    #: inputs whose content differs between the two runs (config key -> "recorded sha256 -> new sha256"):
    #: a path can name other files than it did when the baseline was recorded
    inputs_differ: dict[str, str] = {}

    def _word(self) -> str:
        return "acceptance" if self.baseline_id.split("/")[0] in ("probe", "bench") else "results"

    def speed_text(self) -> str:
        """'this machine is 1.40x slower (baseline_tok_s 20.3 now, 28.4 recorded)', or why timings are raw."""
        cal = self.calibration
        if cal is None:
            return "no calibration in this run: timings compared as measured"
        if abs(cal.slower_x - 1.0) < 0.005:
            speed = "this machine runs at the recorded speed"
        elif cal.slower_x > 1:
            speed = f"this machine is {cal.slower_x:.2f}x slower"
        else:
            speed = f"this machine is {1 / cal.slower_x:.2f}x faster"
        return f"{speed} ({cal.path} {cal.new:.4g} now, {cal.recorded:.4g} recorded)"

    def text(self) -> str:
        det = [c for c in self.checks if not c.timing]
        tim = [c for c in self.checks if c.timing]
        bad_det = [c for c in det if not c.within]
        bad_tim = [c for c in tim if not c.within]
        word = self._word()
        if self.reproduced:
            first = f"{word} reproduced ({len(det)} metrics within tolerance)"
        else:
            first = f"{word} NOT reproduced ({len(bad_det)} of {len(det)} metrics outside tolerance)"
        head = ("reproduced " if self.reproduced else "NOT reproduced ") + f"{self.baseline_id}: {first}"
        if tim:
            norm = "after normalising" if self.calibration else "as measured"
            timing = (f"{len(tim)} timings within tolerance {norm}" if not bad_tim else
                      f"{len(bad_tim)} of {len(tim)} timings outside tolerance {norm}")
            head += f"; {self.speed_text()}; {timing}"
        lines = [head]
        for key, change in sorted(self.inputs_differ.items()):
            lines.append(f"  input {key} differs by content: {change} (the same path held other files)")
        for c in bad_det + bad_tim:
            new = "missing" if c.new is None else f"{c.new:.6g}"
            norm = f" ({c.normalised:.6g} at the recorded speed)" if c.normalised is not None else ""
            lines.append(f"  {c.path}: recorded {c.recorded:.6g}, now {new}{norm}, allowed +/-{c.allowed:.6g}")
        return "\n".join(lines)


def calibration(new: Baseline, recorded: Baseline) -> Calibration | None:
    """The speed ratio of the two machines, from the kind's calibration metric measured in both runs."""
    path = CALIBRATION.get(recorded.kind)
    if path is None:
        return None
    old_v, new_v = flatten(recorded.metrics).get(path), flatten(new.metrics).get(path)
    if not old_v or not new_v or old_v <= 0 or new_v <= 0:
        return None
    return Calibration(path=path, recorded=old_v, new=new_v, slower_x=old_v / new_v)


def _normalise(path: str, value: float, cal: Calibration) -> float:
    """A timing as it would read on the recorded machine: rates times, durations divided by, the slow-down;
    ratios of times and break-even (rate x duration) do not change with a uniform slow-down."""
    unit = unit_of(path.rsplit(".", 1)[-1])
    if unit == "_tok_s":
        return value * cal.slower_x
    if unit in ("_ms", "_s"):
        return value / cal.slower_x
    return value


def _check(recorded: Baseline, path: str, old: float, value: float | None, timing: bool,
           cal: Calibration | None) -> MetricCheck:
    allowed = allowed_delta(recorded, path)
    normalised = _normalise(path, value, cal) if (timing and cal is not None and value is not None) else None
    seen = normalised if normalised is not None else value
    delta = None if value is None else value - old
    within = seen is not None and abs(seen - old) <= allowed + 1e-12 * max(1.0, abs(old))
    return MetricCheck(path=path, recorded=old, new=value, delta=delta, allowed=allowed, within=within,
                       timing=timing, normalised=normalised)


def compare(new: Baseline, recorded: Baseline) -> Comparison:
    """Each recorded metric against the new run: deterministic ones within their tolerance, timings within
    theirs after normalising by the run's calibration. ``reproduced`` is the deterministic verdict (the
    timings' alone when a result has nothing deterministic); ``timing_reproduced`` the timings'."""
    old_m, new_m = flatten(recorded.metrics), flatten(new.metrics)
    cal = calibration(new, recorded)
    checks = [_check(recorded, path, old, new_m.get(path), is_timing(recorded.kind, path), cal)
              for path, old in old_m.items()]
    det = [c.within for c in checks if not c.timing]
    tim = [c.within for c in checks if c.timing]
    return Comparison(baseline_id=recorded.id, reproduced=all(det) if det else all(tim),
                      timing_reproduced=all(tim) if tim else None, calibration=cal, checks=checks,
                      inputs_differ=inputs_differ(new, recorded))


def inputs_differ(new: Baseline, recorded: Baseline) -> dict[str, str]:
    """Inputs both runs hashed whose sha256 differs: config key -> "OLD -> NEW" (first 12 hex digits each)."""
    old_in, new_in = recorded.provenance.inputs or {}, new.provenance.inputs or {}
    return {k: f"{old_in[k].sha256[:12]} -> {new_in[k].sha256[:12]}" for k in sorted(set(old_in) & set(new_in))
            if old_in[k].sha256 and new_in[k].sha256 and old_in[k].sha256 != new_in[k].sha256}

