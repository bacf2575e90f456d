"""The invoke namespace: one collection per runbooks/ module (`invoke --list`)."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

from invoke import Collection

ROOT = Path(__file__).resolve().parent
# Work from a plain checkout too (before `pip install -e .`): the library lives in src/.
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))
os.environ.setdefault("EAGLEKB_ROOT", str(ROOT))

from runbooks._common import parse_errors_exit_2  # noqa: E402 - after the path set-up above

parse_errors_exit_2()  # invoke's own "No idea what ... is!" and friends: one error line, exit 2
ns = Collection()
for module_name in ("plan", "baselines", "docs", "models", "inspect", "vocab", "remap",
                    "datagen", "finetune", "probe", "bench", "sglang", "story", "recipe"):
    try:
        module = importlib.import_module(f"runbooks.{module_name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"runbooks.{module_name}":
            continue  # that area has not landed yet
        raise
    ns.add_collection(Collection.from_module(module), name=module_name)
