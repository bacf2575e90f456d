"""Provenance capture: where, when and how a number was produced.

Owns: reading the git state, the host (CPU, GPUs, driver, load average), package versions and
selected environment variables into a plain dict that ``eaglekb.kb.schema``
validates and ``eaglekb.kb.baselines`` stores; ``from_device_env`` builds the same
dict for a run made on another machine; and identity by content (``content_identity``):
the sha256 of the drafter files, target weights and dataset manifest a run read, beside
the path its config names (``INPUT_KEYS``), so that two runs of one path holding different
weights can be told apart. Knows nothing about baselines files,
pydantic or the task runner.
Every probe is best-effort: a missing tool records ``None``, never raises.
"""

from __future__ import annotations

import os
import platform
from fnmatch import fnmatch
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from eaglekb import __version__
from eaglekb.io.pieces import sha256_file, sha256_files
from eaglekb.models import sources

#: Environment variables recorded with every result (prefixes and exact names).
ENV_PREFIXES = ("NCCL_", "CUDA_", "SGLANG_", "TORCH_", "NVSHMEM_", "OMP_", "MKL_", "EAGLEKB_")
ENV_NAMES = ("PYTORCH_CUDA_ALLOC_CONF", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "OPENBLAS_CORETYPE")
#: Packages whose versions are recorded (absent ones record None).
PACKAGES = ("torch", "transformers", "safetensors", "sglang", "eaglekb", "numpy", "accelerate", "gguf")


def _run(args: list[str], cwd: Path | None = None, timeout: float = 5.0) -> str | None:
    try:
        out = subprocess.run(
            args, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state(root: Path) -> dict[str, Any]:
    """Commit hash and whether the working tree has uncommitted changes.

    ``EAGLEKB_GIT_COMMIT`` (and ``EAGLEKB_GIT_DIRTY``, 0 or 1) override git for a copy of the tree
    whose ``.git`` is absent or stale, such as a working tree copied to another machine without its history."""
    if os.environ.get("EAGLEKB_GIT_COMMIT"):
        return {"git_commit": os.environ["EAGLEKB_GIT_COMMIT"],
                "git_dirty": os.environ.get("EAGLEKB_GIT_DIRTY", "0") not in ("0", "", "false")}
    commit = _run(["git", "rev-parse", "HEAD"], cwd=root)
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root)
    return {"git_commit": commit, "git_dirty": None if status is None else bool(status)}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_state() -> dict[str, Any]:
    """GPUs as torch and nvidia-smi see them (empty list on a CPU machine)."""
    gpus: list[dict[str, Any]] = []
    driver = None
    smi = _run(
        [
            "nvidia-smi",
            "--query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,pstate,temperature.gpu,power.draw",
            "--format=csv,noheader,nounits",
        ]
    )
    if smi:
        keys = ["name", "memory_total_mib", "driver", "sm_clock_mhz", "sm_clock_max_mhz",
                "mem_clock_mhz", "pstate", "temperature_c", "power_w"]
        for line in smi.splitlines():
            row = dict(zip(keys, (v.strip() for v in line.split(","))))
            driver = row.pop("driver", driver)
            gpus.append(row)
    cuda = None
    try:
        import torch

        if torch.cuda.is_available():
            cuda = torch.version.cuda
            if not gpus:
                gpus = [{"name": torch.cuda.get_device_name(i)} for i in range(torch.cuda.device_count())]
    except Exception:  # torch absent or broken: provenance must never fail a run
        pass
    return {"gpus": gpus, "gpu_driver": driver, "cuda": cuda}


def load_average() -> list[float] | None:
    """The 1, 5 and 15-minute load averages when the result is recorded (the run's own threads count in
    them): a reader tells a quiet machine from a busy one; None where the OS has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def host_state() -> dict[str, Any]:
    return {
        "hostname": platform.node(),
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "load_avg": load_average(),
        **gpu_state(),
    }


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def selected_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    env = os.environ if environ is None else environ
    return {
        k: v
        for k, v in sorted(env.items())
        if k.startswith(ENV_PREFIXES) or k in ENV_NAMES
    }


def capture(command: str | None = None, root: Path | None = None) -> dict[str, Any]:
    """Everything needed to say where a result came from; ``command`` defaults to argv."""
    root = root or Path.cwd()
    return {
        "command": command if command is not None else " ".join(sys.argv),
        **git_state(root),
        "host": host_state(),
        "versions": package_versions(),
        "env": selected_env(),
    }


def from_device_env(env: dict[str, Any], command: str, commit: str | None, driver: str | None = None,
                    cpus: int | None = None) -> dict[str, Any]:
    """Provenance of a run made on another machine, from the small ``env`` its JSON carries.

    That machine may have no git checkout (so the commit is given) and may lack packages we would
    otherwise ask for; a fuller capture taken there (``capture()``'s shape) is used as is instead.
    """
    if "host" in env and isinstance(env["host"], dict):  # a full capture() made on that machine
        return {**env, "command": command, "git_commit": commit, "git_dirty": False}
    return {
        "command": command,
        "git_commit": commit,
        "git_dirty": False,
        "host": {"hostname": env.get("host"), "os": None, "machine": "x86_64", "cpu": None, "cpu_count": cpus,
                 "gpus": [{"name": env.get("gpu")}] if env.get("gpu") else [], "gpu_driver": driver,
                 "cuda": env.get("cuda")},
        "versions": {"python": env.get("python"), "torch": env.get("torch"), "transformers": env.get("transformers"),
                     "eaglekb": __version__, "sglang": None},
        "env": {},
    }


# --------------------------------------------------------------------------- identity by content

#: Config keys (dotted paths into a result's config) that name a file or folder a run read, and what it is.
#: A drafter is hashed by its config.json and weights, a target by its weights (an embedded model by the
#: pinned GGUF its conversion verified), a dataset by its manifest (which holds every shard's sha256).
INPUT_KEYS: dict[str, str] = {
    "drafter": "drafter", "reference_drafter": "drafter", "init": "drafter",
    "target": "target", "model": "target", "online_target": "target",
    "data": "dataset", "val_data": "dataset", "dataset": "dataset",
    "mapping": "file", "mapping_a": "file", "mapping_b": "file",
    "server_info.speculative_draft_model_path": "drafter", "server_info.model_path": "target",
    "plain_server_info.model_path": "target", "target_path": "target",
}
#: The files that identify a folder of each role, as glob patterns relative to it, in hashing order.
ROLE_FILES: dict[str, tuple[str, ...]] = {
    "drafter": ("config.json", "*.safetensors"),
    "target": ("config.json", "*.safetensors"),
    "dataset": ("manifest.json",),
}
EMBEDDED_BASIS = "the pinned GGUF sha256 of embedded model {name} (its conversion verifies it; eaglekb-manifest.json)"


def config_inputs(config: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """The inputs a config names: dotted key -> (role, value as recorded), for string values only."""
    out: dict[str, tuple[str, str]] = {}
    for key, role in INPUT_KEYS.items():
        node: Any = config
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, str) and node.strip():
            out[key] = (role, node)
    return out


def role_files(role: str, names: list[str]) -> list[str]:
    """Of the file NAMES in a folder, those that identify it for ROLE, in hashing order; empty unless every
    pattern matches (a drafter without its weights has no identity: the files are away, not different)."""
    picked: list[str] = []
    for pattern in ROLE_FILES.get(role, ()):
        found = sorted(n for n in names if fnmatch(n, pattern) and n not in picked)
        if not found:
            return []
        picked += found
    return picked


def embedded_name(value: str) -> str | None:
    """The embedded model a target value names: its name, or its cache folder (``.../models/NAME``)."""
    if value in sources.SOURCES:
        return value
    parts = Path(value).parts
    return parts[-1] if len(parts) >= 2 and parts[-2] == "models" and parts[-1] in sources.SOURCES else None


def _embedded_identity(name: str) -> dict[str, Any]:
    pinned = sources.SOURCES[name].sha256
    manifest = sources.read_manifest(sources.model_dir(name)) or {}
    found = manifest.get("sha256") or pinned
    entry = {"sha256": found, "files": {}, "basis": EMBEDDED_BASIS.format(name=name)}
    if found != pinned:
        entry["basis"] += f"; differs from the pin {pinned}"
    return entry


#: Per-file hashes are recorded for folders up to this size (a drafter); a larger one (a target's weights)
#: is read once, for the folder's hash alone.
PER_FILE_LIMIT = 256 << 20


def _folder_identity(folder: Path, role: str) -> dict[str, Any]:
    names = role_files(role, [p.name for p in folder.iterdir() if p.is_file()])
    if not names:
        return {"sha256": None, "unknown": f"the folder lacks {' + '.join(ROLE_FILES[role])} (incomplete)"}
    files = [folder / n for n in names]
    small = sum(f.stat().st_size for f in files) <= PER_FILE_LIMIT
    return {"sha256": sha256_files(files), "files": {n: sha256_file(p) for n, p in zip(names, files)} if small else {},
            "basis": "hashed when the result was recorded: " + " + ".join(names)}


def _locate(value: str, root: Path) -> Path | None:
    for base in (root, Path.cwd()):
        path = (base / Path(value).expanduser()) if not Path(value).expanduser().is_absolute() else Path(value).expanduser()
        if path.exists():
            return path
    return None


#: Why a ``random...`` drafter (``eaglekb.measure.setup.read_drafter``: seeded, for timings) has no hash: the
#: recorded command builds it again, so it is the record's own, not a file a clone must hold.
BUILT_BY_COMMAND = "no file: a seeded random drafter the recorded command builds (timings only)"


def is_random_drafter(value: object) -> bool:
    """Whether a drafter value is a random-drafter spec (``random``, ``random:N``, ``random:...:p-eagle:K``) rather
    than a folder: the one rule ``eaglekb.measure.setup`` builds it by and this module records it by."""
    return str(value).startswith("random")


def input_identity(role: str, value: str, root: Path) -> dict[str, Any]:
    """The content identity of one input: ``sha256`` (of the identifying files, read in order), ``files``
    (name -> sha256), ``basis`` (how it was obtained), or ``sha256`` None with ``unknown`` (why not)."""
    entry: dict[str, Any] = {"role": role, "path": value}
    name = embedded_name(value) if role == "target" else None
    if name:
        return entry | _embedded_identity(name)
    path = _locate(value, root)
    if path is None and role == "drafter" and is_random_drafter(value):
        return entry | {"sha256": None, "unknown": BUILT_BY_COMMAND}
    if path is None:
        return entry | {"sha256": None, "unknown": "not found on the machine that recorded the result"}
    try:
        if path.is_dir():
            return entry | _folder_identity(path, role if role in ROLE_FILES else "drafter")
        digest = sha256_file(path)
        return entry | {"sha256": digest, "files": {path.name: digest}, "basis": "hashed when the result was recorded"}
    except OSError as exc:
        return entry | {"sha256": None, "unknown": f"unreadable when the result was recorded ({exc.strerror or exc})"}


def content_identity(config: dict[str, Any], root: Path | None = None) -> dict[str, dict[str, Any]]:
    """The sha256 of every file a run read, as named by its config (``INPUT_KEYS``), beside the path:
    config key -> ``input_identity``. Stored as ``provenance.inputs``; never raises for a missing file."""
    root = root or Path.cwd()
    return {key: input_identity(role, value, root) for key, (role, value) in config_inputs(config).items()}
