"""Recipes: a whole training pipeline (datagen, vocab, finetune, probe, bench) as one YAML file, run in order.

Owns the recipe format (docs/howto/recipes.md) and its run. ``load`` reads a recipe (``io.strict_yaml``; an unknown
key, task or option is one line naming the file, the key and the nearest valid name), applies ``--set`` and
expands ``{run}``, ``{name}``, ``{target}`` and ``{record:STEP}`` (the record an earlier step writes); ``select``
picks ``--only`` / ``--from``; ``plan`` turns each step into its exact command and, with ``--resume``, marks the
steps the state already records as finished with the same command; ``execute`` runs them one by one through a
runner (by default ``python -m invoke ...`` from the repository root), stops at the first failure (then runs
only the recipe's ``always`` steps, e.g. stopping servers it started) and keeps ``{run}/recipe-state.json``
(written atomically after every step); ``run_recipe`` does all of it for ``invoke recipe``.

The rules of a run, beside the format:

* Without ``--resume``, a run folder whose state records a finished step is refused unless ``--only`` or
  ``--from`` says which steps to run again (a changed option never silently mixes two runs' outputs).
* With ``--resume``, a step recorded as finished with the same command is skipped; from the first step that
  runs, every later selected step runs too. A step with a resume option (finetune's ``--resume``) gets it when
  its output folder holds a checkpoint.

Knows nothing about the task runner: the caller passes each task's options (``TaskOptions``), how to find a
run folder's newest checkpoint, and may pass another runner (the tests' fake one).
"""

from __future__ import annotations

import datetime as _dt
import difflib
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from eaglekb.io import strict_yaml
from eaglekb.io.errors import BadInput
from eaglekb.io.files import atomic_write_json, not_a_file, read_json, read_text

TOP_KEYS = ("name", "target", "device", "nproc", "always", "steps")  # --set takes all but steps
DEVICES = ("cpu", "cuda")
STATE_FILE = "recipe-state.json"
RUNS = Path(".eaglekb") / "runs"
SHARED = ("target", "device", "nproc")  # top-level keys given to the steps whose task has that option
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*|record:[^{}\s]+)\}")
_RECORD = "record:"  # {record:STEP}: the record an earlier step writes (its own record option or --record-prefix)
#: How each kind of option is written: a value, a flag (off by default), a flag on by default, repeatable.
KINDS = ("value", "flag", "negatable", "list")

Runner = Callable[[list[str], Path], int]


@dataclass(frozen=True)
class TaskOptions:
    """What a recipe may give one task: its command, each option's kind, which are required, which take the
    recipe's shared target/device/nproc, and its resume flag (continues from the newest checkpoint in --out)."""

    command: str  # invoke datagen, invoke vocab.build
    options: dict[str, str]  # option name (underscores) -> one of KINDS
    required: tuple[str, ...] = ()
    shared: frozenset[str] = frozenset()
    resume: str | None = None


@dataclass
class Step:
    key: str  # as the recipe names it (probe@humaneval)
    task: str  # probe
    options: dict[str, Any]
    argv: list[str] = field(default_factory=list)

    @property
    def command(self) -> str:
        return shlex.join(self.argv)


@dataclass
class Recipe:
    file: str
    name: str
    run: Path  # the run folder (absolute)
    run_text: str  # as commands write it: relative to the root when inside it
    target: str | None
    device: str | None
    nproc: int
    steps: list[Step]
    root: Path
    always: tuple[str, ...] = ()  # steps that still run after one fails (stopping the servers the recipe started)


@dataclass
class Planned:
    step: Step
    argv: list[str]  # what runs (the step's command, plus a resume flag where one applies)
    skip: str | None = None  # why it does not run (finished before, --resume)
    note: str | None = None

    @property
    def command(self) -> str:
        return shlex.join(self.argv)


def _bad(what: str, where: str, expected: str, found: Any, choices: list[str] | None = None) -> BadInput:
    near = difflib.get_close_matches(str(found), choices or [], n=1, cutoff=0.5)
    fix = f"did you mean {near[0]}?" if near else None
    text = str(found)
    return BadInput(what, where=where, expected=expected, found=text if len(text) <= 80 else text[:77] + "...",
                    fix=fix)


def _norm(key: Any) -> str:
    return str(key).replace("-", "_")


def read(path: str | Path) -> dict:
    """The recipe file as a mapping (``strict_yaml.load``: no duplicate keys, no alias bombs); one line when it
    is missing or not a mapping."""
    doc = strict_yaml.load(read_text(path, what="recipe file"), where=str(path),
                           expected="a recipe (name, target, device, nproc, steps)")
    if not isinstance(doc, dict):
        raise BadInput("not a recipe", where=str(path), expected="a YAML mapping with name, target, device, steps",
                       found=type(doc).__name__)
    return doc


def override(doc: dict, sets: list[str] | None, file: str) -> dict:
    """``--set STEP.OPTION=VALUE`` (or ``--set KEY=VALUE`` for a top-level key) applied; VALUE read as YAML."""
    doc = dict(doc)
    steps = dict(doc.get("steps") or {}) if isinstance(doc.get("steps"), dict) else doc.get("steps")
    for item in sets or []:
        key, eq, raw = str(item).partition("=")
        if not eq or not key.strip():
            raise BadInput("bad override", where=f"--set {item}", expected="STEP.OPTION=VALUE or KEY=VALUE",
                           found=repr(item)[:80])
        try:
            value = strict_yaml.load(raw, where=f"--set {item}", expected="a YAML value") if raw.strip() else None
        except BadInput:
            value = raw
        key = key.strip()
        if "." not in key:
            if _norm(key) not in TOP_KEYS or _norm(key) == "steps":
                raise _bad("unknown top-level key", f"--set {item}", ", ".join(TOP_KEYS[:-1]), key,
                           list(TOP_KEYS[:-1]))
            doc[_norm(key)] = value
            continue
        step, _, option = key.rpartition(".")
        if not isinstance(steps, dict) or step not in steps:
            raise _bad("no such step in the recipe", f"--set {item} ({file})", "a step of the recipe: " +
                       ", ".join(steps or []), step, list(steps or []))
        opts = dict(steps[step] or {}) if isinstance(steps[step], dict) else steps[step]
        if isinstance(opts, dict):
            opts = {_norm(k): v for k, v in opts.items()}
            opts[_norm(option)] = value
        steps[step] = opts
    if steps is not None:
        doc["steps"] = steps
    return doc


def _expand(value: Any, names: dict[str, str], where: str) -> Any:
    """``{run}``, ``{name}``, ``{target}`` and ``{record:STEP}`` replaced in a value (and in each item of a list)."""
    if isinstance(value, list):
        return [_expand(v, names, where) for v in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match) -> str:
        if match.group(1) in names:
            return names[match.group(1)]
        if match.group(1).startswith(_RECORD):
            raise BadInput("no record to refer to", where=where, found=match.group(0), expected="{record:STEP} "
                           "of an earlier step that records (its record option, or --record-prefix)")
        raise _bad("unknown placeholder", where, "{run}, {name}, {target} or {record:STEP}", match.group(0),
                   ["{" + n + "}" for n in names])

    return _PLACEHOLDER.sub(one, value)


def _top(doc: dict, file: str) -> tuple[str, str | None, str | None, int]:
    """The recipe's name, target, device and nproc, checked."""
    for key in doc:
        if key not in TOP_KEYS:
            raise _bad("unknown top-level key", f"{file}: {key}", ", ".join(TOP_KEYS), key, list(TOP_KEYS))
    name = doc.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise BadInput("bad recipe name", where=f"{file}: name", expected="letters, digits, '.', '_' or '-'",
                       found=repr(name)[:80])
    target = doc.get("target")
    if target is not None and (not isinstance(target, str) or not target.strip()):
        raise BadInput("bad target", where=f"{file}: target", expected="an embedded name, a repo id or a folder",
                       found=repr(target)[:80])
    device = doc.get("device")
    if device is not None and device not in DEVICES:
        raise _bad("bad device", f"{file}: device", " or ".join(DEVICES), device, list(DEVICES))
    nproc = doc.get("nproc", 1)
    if isinstance(nproc, bool) or not isinstance(nproc, int) or not 1 <= nproc <= 1024:
        raise BadInput("bad nproc", where=f"{file}: nproc", expected="a whole number from 1 (processes, one per GPU)",
                       found=repr(nproc)[:80])
    if not isinstance(doc.get("steps"), dict) or not doc["steps"]:
        raise BadInput("no steps", where=f"{file}: steps", expected="a mapping of task -> options, in order",
                       found=repr(doc.get("steps"))[:80])
    return name, target, device, nproc


def _run_folder(name: str, run_dir: str | Path | None, root: Path) -> tuple[Path, str]:
    run = Path(run_dir).expanduser() if run_dir else root / RUNS / name
    run = run if run.is_absolute() else Path.cwd() / run
    run = Path(str(run.resolve()))
    try:
        text = run.relative_to(root.resolve()).as_posix()
    except ValueError:
        text = str(run)
    return run, text


def record_name(prefix: str, key: str) -> str:
    """The record a step writes under ``--record-prefix PREFIX``: PREFIX-KEY with '@' and '.' as '-' (probe@humaneval ->
    PREFIX-probe-humaneval, vocab.build -> PREFIX-vocab-build): one name per step, distinct across kinds."""
    return f"{prefix}-" + re.sub(r"[^a-z0-9_-]", "-", key.lower())


def load(path: str | Path, tasks: dict[str, TaskOptions], *, sets: list[str] | None = None,
         run_dir: str | Path | None = None, root: str | Path = ".", record_prefix: str | None = None,
         check_name: Callable[[str, str], None] = lambda name, where: None) -> Recipe:
    """Read, override, check and expand a recipe; each step's command built (``Step.argv``). With
    ``record_prefix``, every step whose task records and that names no record of its own records as
    ``record_name(record_prefix, key)``;
    ``check_name(name, where)`` refuses a name the baselines would not take, before any step runs."""
    file = str(path)
    doc = override(read(path), sets, file)
    name, target, device, nproc = _top(doc, file)
    root = Path(root).resolve()
    run, run_text = _run_folder(name, run_dir, root)
    names = {"run": run_text, "name": name}
    if target is not None:
        target = _expand(target, names, f"{file}: target")
    names["target"] = target or ""
    steps = []
    for key, opts in doc["steps"].items():
        task = str(key).partition("@")[0]
        where = f"{file}: steps.{key}"
        if task not in tasks:
            raise _bad("unknown task", where, "a task of `invoke --list` (datagen, vocab.build, finetune, probe, "
                       "bench ...)", task, list(tasks))
        if opts is not None and not isinstance(opts, dict):
            raise BadInput("step options are not a mapping", where=where, expected="{option: value, ...}",
                           found=type(opts).__name__)
        spec = tasks[task]
        given = {}
        for opt, value in (opts or {}).items():
            norm = _norm(opt)
            if norm not in spec.options:
                raise _bad(f"not an option of {spec.command}", f"{where}.{opt}", f"an option of {spec.command}",
                           opt, sorted(spec.options))
            given[norm] = _expand(value, names, f"{where}.{opt}")
        if record_prefix and "record" in spec.options and given.get("record") is None:
            given["record"] = record_name(record_prefix, str(key))
            check_name(given["record"], f"--record-prefix {record_prefix}")
        if given.get("record"):
            names[_RECORD + str(key)] = str(given["record"])
        step = Step(key=str(key), task=task, options=given)
        step.argv = _argv(step, spec, {"target": target, "device": device, "nproc": nproc if nproc > 1 else None},
                          where)
        steps.append(step)
    return Recipe(file=file, name=name, run=run, run_text=run_text, target=target, device=device, nproc=nproc,
                  steps=steps, root=root, always=_always(doc.get("always"), [s.key for s in steps], file))


def _always(value: Any, keys: list[str], file: str) -> tuple[str, ...]:
    """``always: [STEP, ...]``: steps of this recipe that run even after an earlier step failed."""
    items = [] if value is None else value if isinstance(value, list) else [value]
    for item in items:
        if str(item) not in keys:
            raise _bad("always names no step of the recipe", f"{file}: always", "steps of the recipe: "
                       + ", ".join(keys), item, keys)
    return tuple(str(item) for item in items)


def _word(value: Any, option: str, where: str) -> str:
    if isinstance(value, bool):  # YAML reads on/off/yes/no as booleans: a value option gets on/off back
        return "on" if value else "off"
    if isinstance(value, (dict, list)):
        raise BadInput("option takes one value", where=where, expected=f"one value for --{option}",
                       found=type(value).__name__)
    text = str(value)
    if "\x00" in text or text.strip() in ("--help", "-h"):  # a NUL cannot be passed on; a help word runs nothing
        raise BadInput("option value cannot be passed to the task", where=where,
                       expected="a value for --" + option.replace("_", "-"), found=repr(text)[:80])
    return text


def _pair(flag: str, word: str) -> list[str]:
    """``--flag VALUE``, or ``--flag=VALUE`` when VALUE starts with '-' (the task would read it as an option)."""
    return [f"{flag}={word}"] if word.startswith("-") else [flag, word]


def _argv(step: Step, spec: TaskOptions, shared: dict[str, Any], where: str) -> list[str]:
    """The step's command: the recipe's shared values first (where the task has them and the step does not
    give its own), then the step's options in the order the recipe writes them; ``null`` leaves one out."""
    values = {k: v for k, v in shared.items() if k in spec.shared and v is not None and k not in step.options}
    values.update(step.options)
    for name in spec.required:
        if values.get(name) is None:
            raise BadInput(f"missing required option of {spec.command}", where=where,
                           expected=f"{name}: VALUE", found="nothing")
    argv = shlex.split(spec.command)
    for name, value in values.items():
        if value is None:
            continue
        flag = "--" + name.strip("_").replace("_", "-")
        kind = spec.options[name]
        if kind in ("flag", "negatable"):
            if not isinstance(value, bool):
                raise BadInput("option is a switch", where=f"{where}.{name}", expected="true or false",
                               found=repr(value)[:80])
            if value != (kind == "negatable"):
                argv.append(flag if value else "--no-" + flag[2:])
        elif kind == "list":
            for item in value if isinstance(value, list) else [value]:
                argv += _pair(flag, _word(item, name, f"{where}.{name}"))
        else:
            argv += _pair(flag, _word(value, name, f"{where}.{name}"))
    return argv


def select(recipe: Recipe, only: str | None = None, start: str | None = None) -> list[Step]:
    """The steps ``--only STEP[,STEP]`` or ``--from STEP`` picks (all of them without either), in recipe order."""
    keys = [s.key for s in recipe.steps]
    if only and start:
        raise BadInput("give --only or --from, not both", where="--only/--from", expected="one of them",
                       found=f"--only {only} --from {start}")

    def known(key: str, option: str) -> str:
        if key not in keys:
            raise _bad("no such step in the recipe", f"{option} {key}", "one of " + ", ".join(keys), key, keys)
        return key

    if only:
        wanted = {known(k.strip(), "--only") for k in str(only).split(",") if k.strip()}
        if not wanted:
            raise BadInput("no step named", where=f"--only {only}", expected="STEP[,STEP] of " + ", ".join(keys),
                           found="none")
        return [s for s in recipe.steps if s.key in wanted]
    if start:
        return recipe.steps[keys.index(known(str(start).strip(), "--from")):]
    return list(recipe.steps)


def read_state(recipe: Recipe) -> dict:
    """The run folder's state (empty when there is none yet)."""
    path = recipe.run / STATE_FILE
    if not path.is_file():
        return {"steps": {}}
    doc = read_json(path, what="recipe state")
    if not isinstance(doc, dict) or not isinstance(doc.get("steps"), dict):
        raise BadInput("not a recipe state file", where=str(path), expected='{"steps": {...}}',
                       found=type(doc).__name__, fix="remove it to start the run again")
    return doc


def finished(state: dict, step: Step) -> bool:
    rec = state["steps"].get(step.key) or {}
    return rec.get("exit_code") == 0 and rec.get("recipe_command") == step.command


def plan(recipe: Recipe, steps: list[Step], tasks: dict[str, TaskOptions], *, resume: bool = False,
         newest_checkpoint: Callable[[Path], Path | None] = lambda out: None, explicit: bool = False,
         dry_run: bool = False) -> list[Planned]:
    """What each selected step runs, or why it is skipped (``--resume``: finished before with this command)."""
    state = read_state(recipe)
    done = [s.key for s in steps if (state["steps"].get(s.key) or {}).get("exit_code") == 0]
    if done and not resume and not explicit and not dry_run:
        raise BadInput("the run folder holds finished steps", where=str(recipe.run / STATE_FILE),
                       expected="a new run folder, or --resume", found="finished: " + ", ".join(done),
                       fix="add --resume to continue (finished steps with unchanged options are skipped), "
                           "--from STEP or --only STEP to run steps again, or --run-dir for a new run")
    undone = [k for k, rec in state["steps"].items() if (rec or {}).get("after_failure")]
    if resume and undone:  # they may have undone what finished steps set up (a server a launch step started)
        raise BadInput("the recipe's always steps ran after a step failed", where=str(recipe.run / STATE_FILE),
                       expected="--from STEP: the first step to run again", found="ran: " + ", ".join(undone))
    out, running = [], False
    for step in steps:
        if resume and not running and finished(state, step):
            when = state["steps"][step.key].get("finished")
            out.append(Planned(step, step.argv, skip=f"finished {when}" if when else "finished"))
            continue
        running = True
        argv, note = list(step.argv), None
        spec = tasks[step.task]
        if resume and spec.resume and not step.options.get(spec.resume) and step.options.get("out"):
            folder = Path(str(step.options["out"]))
            ckpt = newest_checkpoint(folder if folder.is_absolute() else recipe.root / folder)
            if ckpt is not None:
                argv.append("--" + spec.resume.replace("_", "-"))
                note = f"continues from {ckpt}"
        out.append(Planned(step, argv, note=note))
    return out


def render_plan(recipe: Recipe, planned: list[Planned]) -> str:
    """The dry-run text: one line per step, the exact command (a skipped one as a comment saying why)."""
    lines = [f"# recipe {recipe.file}: run folder {recipe.run_text}"]
    for p in planned:
        if p.skip:
            lines.append(f"# skip {p.step.key} ({p.skip}): {p.command}")
        else:
            lines.append(p.command + (f"  # {p.note}" if p.note else ""))
    return "\n".join(lines)


def run_command(argv: list[str], cwd: Path) -> int:
    """``invoke ...`` as ``python -m invoke ...`` of this Python, from ``cwd``, its output streamed."""
    sys.stdout.flush()
    return subprocess.run([sys.executable, "-m", *argv], cwd=cwd, check=False).returncode


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _save(recipe: Recipe, state: dict) -> None:
    state.update(recipe=recipe.file, name=recipe.name, run=recipe.run_text)
    recipe.run.mkdir(parents=True, exist_ok=True)
    atomic_write_json(recipe.run / STATE_FILE, state)


@dataclass
class Outcome:
    code: int  # 0, or the exit code of the step that failed
    ran: list[str]
    skipped: list[str]
    failed: str | None = None


def execute(recipe: Recipe, planned: list[Planned], *, runner: Runner = run_command,
            log: Callable[[str], None] = lambda line: None) -> Outcome:
    """Run the planned steps in order, the state saved after each; after the first that fails only the recipe's
    ``always`` steps run (the run's exit code stays the failed step's)."""
    state = read_state(recipe)
    outcome = Outcome(code=0, ran=[], skipped=[])
    for i, p in enumerate(planned, 1):
        if outcome.failed and p.step.key not in recipe.always:
            continue
        if p.skip:
            log(f"[{i}/{len(planned)}] skip {p.step.key}: {p.skip}")
            outcome.skipped.append(p.step.key)
            continue
        log(f"[{i}/{len(planned)}] {p.command}" + (f"  # {p.note}" if p.note else ""))
        state["steps"][p.step.key] = {"command": p.command, "recipe_command": p.step.command, "exit_code": None,
                                      "started": _now(), "finished": None}
        if outcome.failed:
            state["steps"][p.step.key]["after_failure"] = outcome.failed
        _save(recipe, state)
        code = 130
        try:
            code = runner(p.argv, recipe.root)
        finally:
            state["steps"][p.step.key].update(exit_code=code, finished=_now())
            _save(recipe, state)
        outcome.ran.append(p.step.key)
        if code != 0 and not outcome.failed:
            outcome.code, outcome.failed = code, p.step.key
    return outcome


def run_recipe(path: str | Path, tasks: dict[str, TaskOptions], *, root: str | Path, sets: list[str] | None = None,
               run_dir: str | Path | None = None, only: str | None = None, start: str | None = None,
               resume: bool = False, dry_run: bool = False, record_prefix: str | None = None,
               check_name: Callable[[str, str], None] = lambda name, where: None,
               newest_checkpoint: Callable[[Path], Path | None] = lambda out: None,
               runner: Runner = run_command, log: Callable[[str], None] = lambda line: None) -> dict:
    """``invoke recipe``: read and check the recipe, choose and plan its steps, then print the plan
    (``dry_run``) or run it. Returns the run's document; ``exit_code`` is the failing step's code (0: none)."""
    if not Path(str(path)).is_file():
        raise not_a_file(Path(str(path)), "recipe file", "a recipe .yaml (see recipes/)")
    recipe = load(path, tasks, sets=sets, run_dir=run_dir, root=root,
                  record_prefix=record_prefix, check_name=check_name)
    if recipe.run.exists() and not recipe.run.is_dir():  # refused before any step runs, not after the first
        raise BadInput("run folder is not a folder", where=f"--run-dir {run_dir}" if run_dir else str(recipe.run),
                       expected="a folder (or a path that does not exist yet)", found="a file")
    planned = plan(recipe, select(recipe, only=only, start=start), tasks, resume=resume,
                   newest_checkpoint=newest_checkpoint, explicit=bool(only or start), dry_run=dry_run)
    doc: dict[str, Any] = {"recipe": str(path), "name": recipe.name, "run": recipe.run_text, "dry_run": dry_run,
                           "steps": [{"step": p.step.key, "command": p.command, "skip": p.skip} for p in planned],
                           "state": f"{recipe.run_text}/{STATE_FILE}"}
    if dry_run:
        doc.update(text=render_plan(recipe, planned), exit_code=0)
        return doc
    outcome = execute(recipe, planned, runner=runner, log=log)
    doc.update(ran=outcome.ran, skipped=outcome.skipped, failed=outcome.failed, exit_code=outcome.code,
               text=f"recipe {recipe.name}: {len(outcome.ran)} steps ran, {len(outcome.skipped)} skipped; "
                    f"state in {doc['state']}")
    return doc
