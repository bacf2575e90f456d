"""`invoke docs.*`: build, serve and deploy the site (strict, offline)."""

from __future__ import annotations

import os
import subprocess
import sys

from invoke import Exit, task


def _env():
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", PYTHONUNBUFFERED="1")
    return env


@task(help={"site_dir": "output folder (default site/)"})
def build(c, site_dir="site"):
    """Build the site with `mkdocs build --strict`; a bad citation or placeholder fails with one line."""
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", site_dir],
        capture_output=True, text=True, env=_env(), check=False,
    )
    if proc.returncode != 0:
        lines = [l for l in (proc.stderr + proc.stdout).splitlines() if "eaglekb:" in l or "Error" in l or "WARNING" in l]
        raise Exit(f"error: docs build failed: {(lines or ['see mkdocs output'])[0].strip()}", code=1)
    print(f"built {site_dir}/ (strict)")


@task(help={"addr": "address to serve on (default 127.0.0.1:8000)"})
def serve(c, addr="127.0.0.1:8000"):
    """Serve the site locally with live reload."""
    c.run(f"{sys.executable} -m mkdocs serve --strict -a {addr}", env=_env(), pty=False)
