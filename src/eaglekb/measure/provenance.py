"""Provenance capture: where, when and how a number was produced.

Owns: reading the git state, the host (CPU, GPUs, driver), package versions and
selected environment variables into a plain dict that ``eaglekb.kb.schema``
validates and ``eaglekb.kb.baselines`` stores; ``from_device_env`` builds the same
dict for a run made on another machine. Knows nothing about baselines files,
pydantic or the task runner.
Every probe is best-effort: a missing tool records ``None``, never raises.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from eaglekb import __version__

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
    whose ``.git`` is absent or stale, such as the working tree sent to a lent GPU machine."""
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


def host_state() -> dict[str, Any]:
    return {
        "hostname": platform.node(),
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
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

    The device machine has no git checkout (so the commit is given) and may lack packages we would
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
