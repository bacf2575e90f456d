"""`invoke docs.*`: build, serve and deploy the site (strict, offline).

Versioned docs use mike: `invoke docs.deploy VERSION` runs the strict build, then
commits that version to the local `gh-pages` branch (never pushed; no remote
needed) under the alias `latest`, which the site root redirects to (the default
alias; `--alias`, `--no-set-default` change that). `invoke docs.versions` lists
what is deployed and `invoke docs.serve-versions` serves the branch with its
version selector; the servers replace the invoke process, so stopping it stops them.
"""

from __future__ import annotations

import json as jsonlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from invoke import Exit

from runbooks._common import one_line, task

ROOT = Path(__file__).resolve().parents[1]  # the checkout whose mkdocs.yml and git branch we use
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


def _env():
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", PYTHONUNBUFFERED="1")
    # mike runs `mkdocs build` by name: make it the one next to this Python.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def _mike() -> list[str]:
    exe = shutil.which("mike", path=_env()["PATH"])
    if exe:
        return [exe]
    return [sys.executable, "-c", "import sys; from mike.driver import main; sys.exit(main())"]


def _first_error(text: str) -> str:
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    for key in ("eaglekb:", "WARNING", "Error", "fatal:", "error:"):
        hits = [l for l in lines if key in l]
        if hits:
            return hits[0]
    return lines[-1] if lines else "no output"


def _build_cause(text: str) -> str:
    """The line that says why a build failed: an eaglekb check, else the exception a traceback ends in,
    else mkdocs's own first warning or error (not a library's log line, such as a notebook kernel's)."""
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    ours = [l for l in lines if "eaglekb:" in l]
    raised = [l for l in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception)\b.*:", l)]
    mkdocs = [l for l in lines if re.match(r"^(ERROR|WARNING)\s+-", l)]
    return (ours[:1] or raised[-1:] or mkdocs[:1] or lines[-1:] or ["no output"])[0]


def _writable(site_dir: str) -> None:
    """The output folder can be created and written, checked before the build (one line naming it)."""
    folder = Path(site_dir) if Path(site_dir).is_absolute() else ROOT / site_dir
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise Exit(f"error: site folder is not writable: in {folder}; found {exc.strerror or exc}; "
                   "fix: choose another --site-dir or fix its permissions", code=2) from None


def _strict_build(site_dir: str) -> None:
    _writable(site_dir)
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", site_dir],
        capture_output=True, text=True, env=_env(), cwd=ROOT, check=False,
    )
    if proc.returncode != 0:
        raise Exit(f"error: docs build failed: {one_line(_build_cause(proc.stderr + proc.stdout))}", code=1)


def _become(cmd: list[str]) -> None:
    """Replace this process with CMD (a server): stopping the task stops the server, no child is left
    behind (a shell and a ``mike serve`` child survived a killed ``invoke`` when run through c.run)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.chdir(ROOT)
    os.execvpe(cmd[0], cmd, _env())


def _config_is_strict() -> bool:
    try:
        text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    except OSError:
        return False
    return re.search(r"^strict:\s*true\s*(#.*)?$", text, re.M) is not None


def _run_mike(args: list[str], what: str) -> str:
    proc = subprocess.run(_mike() + args, capture_output=True, text=True, env=_env(), cwd=ROOT, check=False)
    if proc.returncode != 0:
        raise Exit(f"error: {what} failed: {_first_error(proc.stderr + proc.stdout)}", code=1)
    return proc.stdout


def _check_branch(branch: str) -> None:
    if not branch or not re.match(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$", branch):
        raise Exit(f"error: bad branch name: in --branch; expected letters, digits, . _ / -; found {branch!r}", code=2)


def _deployed(branch: str) -> list[dict]:
    """mike's versions.json on BRANCH ([] when nothing is deployed yet); read with git, no build config."""
    proc = subprocess.run(["git", "show", f"refs/heads/{branch}:versions.json"],
                          capture_output=True, text=True, cwd=ROOT, check=False)
    if proc.returncode != 0:
        return []
    try:
        return jsonlib.loads(proc.stdout or "[]")
    except ValueError:
        raise Exit(f"error: versions.json is not JSON: in branch {branch}; expected mike's list of versions", code=2) from None


@task(help={"site_dir": "output folder (default site/)"})
def build(c, site_dir="site"):
    """Build the site with `mkdocs build --strict`; a bad citation or placeholder fails with one line."""
    _strict_build(site_dir)
    print(f"built {site_dir}/ (strict)")


@task(help={"addr": "address to serve on (default 127.0.0.1:8000)"})
def serve(c, addr="127.0.0.1:8000"):
    """Serve the site locally with live reload."""
    _become([sys.executable, "-m", "mkdocs", "serve", "--strict", "-a", addr])


@task(
    help={
        "version": "the docs version to deploy, e.g. 0.1 (letters, digits, . _ + -)",
        "alias": "an alias to point at this version (default latest; moved here if it exists; '' for none)",
        "set_default": "make the site root redirect to this version, to the alias if given (default on; "
                       "--no-set-default to leave the root as it is)",
        "branch": "the local branch mike commits to (default gh-pages; never pushed)",
        "alias_type": "symlink (default), redirect or copy",
        "json": "print one JSON document as the last line",
    }
)
def deploy(c, version, alias="latest", set_default=True, branch="gh-pages", alias_type="symlink", json=False):
    """Strict `mike deploy --update-aliases VERSION [ALIAS]` to a local branch (no push, no remote)."""
    if not _VERSION.match(version or ""):
        raise Exit(f"error: bad version: in VERSION; expected letters, digits, . _ + - (e.g. 0.1); found {version!r}", code=2)
    if alias and (not _VERSION.match(alias) or alias == version):
        raise Exit(f"error: bad alias: in --alias; expected a name other than the version (e.g. latest); found {alias!r}", code=2)
    if alias_type not in ("symlink", "redirect", "copy"):
        raise Exit(f"error: bad alias type: in --alias-type; expected symlink, redirect or copy; found {alias_type!r}", code=2)
    _check_branch(branch)
    if subprocess.run(["git", "rev-parse", "--git-dir"], capture_output=True, cwd=ROOT, check=False).returncode != 0:
        raise Exit(f"error: not a git repository: in {ROOT}; expected a checkout (mike commits to a branch)", code=2)
    # mike builds with plain `mkdocs build` (no --strict flag). With `strict: true` in mkdocs.yml
    # that build is strict all the same (a warning aborts it and nothing is committed); without
    # it, a strict build runs first so that a warning can never reach the branch.
    if not _config_is_strict():
        with tempfile.TemporaryDirectory(prefix="eaglekb-site-") as tmp:
            _strict_build(tmp)
    args = ["deploy", "--update-aliases", "--alias-type", alias_type, "--branch", branch, version]
    if alias:
        args.append(alias)
    _run_mike(args, "mike deploy")
    if set_default:
        _run_mike(["set-default", "--branch", branch, alias or version], "mike set-default")
    commit = subprocess.run(["git", "rev-parse", "--short", branch], capture_output=True, text=True,
                            cwd=ROOT, check=False).stdout.strip()
    doc = {"version": version, "aliases": [alias] if alias else [], "branch": branch,
           "branch_commit": commit, "default": (alias or version) if set_default else None,
           "versions": _deployed(branch), "pushed": False}
    text = (f"deployed docs {version}" + (f" (alias {alias})" if alias else "")
            + f" to local branch {branch} at {commit}; not pushed"
            + (f"; site root redirects to {alias or version}" if set_default else "")
            + "\nview: invoke docs.serve-versions")
    if json:
        print(jsonlib.dumps(doc, sort_keys=True))
    else:
        print(text)


@task(help={"branch": "the branch mike deployed to (default gh-pages)",
            "json": "print one JSON document as the last line"})
def versions(c, branch="gh-pages", json=False):
    """List the docs versions deployed with `invoke docs.deploy` (mike's versions.json)."""
    _check_branch(branch)
    found = _deployed(branch)
    if json:
        print(jsonlib.dumps({"branch": branch, "versions": found}, sort_keys=True))
        return
    if not found:
        print(f"no docs versions on branch {branch}; deploy one with `invoke docs.deploy VERSION --alias latest`")
        return
    for v in found:
        aliases = f" [{', '.join(v['aliases'])}]" if v.get("aliases") else ""
        print(f"{v['version']}{aliases}")


@task(help={"addr": "address to serve on (default 127.0.0.1:8000)",
            "branch": "the branch mike deployed to (default gh-pages)"})
def serve_versions(c, addr="127.0.0.1:8000", branch="gh-pages"):
    """Serve every deployed docs version with its version selector (`mike serve`), offline."""
    _check_branch(branch)
    if not _deployed(branch):
        raise Exit(f"error: no docs deployed: in branch {branch}; expected at least one version; "
                   "fix: invoke docs.deploy VERSION --alias latest", code=2)
    _become(_mike() + ["serve", "--branch", branch, "-a", addr])
