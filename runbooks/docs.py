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

from eaglekb.io.errors import BadInput, Unavailable
from eaglekb.io.files import guard_output
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
    """The line that says why mike (or the git or mkdocs under it) failed: an eaglekb check, git's ``fatal:``,
    mkdocs's own ERROR/WARNING line (the build is strict), mike's ``error:``, an exception; never a library's
    log line (a notebook kernel's TCP warning, a deprecation notice) when a real reason is there."""
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    for pattern in (r"eaglekb:", r"^fatal:", r"^(ERROR|WARNING)\s+-", r"^(mike: )?error:",
                    r"^[A-Za-z_][\w.]*(Error|Exception)\b.*:"):
        hits = [l for l in lines if re.search(pattern, l)]
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


def _is_site(folder: Path) -> bool:
    """A folder mkdocs built before (what a rebuild may replace: mkdocs empties the folder first)."""
    return (folder / "index.html").is_file() and ((folder / "sitemap.xml").is_file() or (folder / "404.html").is_file()
                                                  or (folder / "search").is_dir())


def _check_site_dir(site_dir: str) -> None:
    """mkdocs deletes what the site folder holds before it builds: only a new or empty folder, or a site it
    built before, never the sources or a folder git tracks files in."""
    folder = Path(site_dir) if Path(site_dir).is_absolute() else ROOT / site_dir
    guard_output(folder, where=f"--site-dir {site_dir}", folder=True, ours=_is_site, reuse=True,
                 what="site folder", inputs=[ROOT / "docs", ROOT / "mkdocs.yml", ROOT / "baselines"])


def _strict_build(site_dir: str) -> None:
    _check_site_dir(site_dir)
    from eaglekb.io.progress import still_working

    _writable(site_dir)
    with still_working("building the site (mkdocs build --strict: baselines, plots, notebook, llms.txt)"):
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


#: Names mike writes at the branch's root: a version or alias of one of these names would replace it.
_MIKE_FILES = {"versions.json", "index.html", "404.html", ".nojekyll", "cname", "robots.txt", "sitemap.xml",
               "sitemap.xml.gz", "favicon.ico"}


def _check_name(name: str, option: str) -> None:
    """A version or alias that is a folder name of its own, not one of mike's files or a file-like name."""
    if name.lower() in _MIKE_FILES or re.search(r"\.(html?|json|xml|txt|js|css|gz|ico|png|svg)$", name, re.I):
        raise BadInput("name collides with a file of the docs branch", where=option,
                       expected="a version such as 0.1 or 1.2.3 (mike keeps versions.json, index.html ... at the "
                                "branch root)", found=repr(name), fix="choose another name")


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT, check=False)


def _check_docs_branch(branch: str) -> None:
    """mike commits the site onto BRANCH: never a branch a work tree has checked out (the site would land on
    top of the sources), never an existing branch that is not a docs branch (no versions.json at its tip)."""
    listed = _git("worktree", "list", "--porcelain").stdout
    checked_out = {l.split(" ", 1)[1].removeprefix("refs/heads/") for l in listed.splitlines() if l.startswith("branch ")}
    if branch in checked_out:
        raise BadInput("branch is checked out", where="--branch", expected="a branch for the site only (default gh-pages)",
                       found=f"{branch!r}, the branch a work tree of this repository has checked out",
                       fix="choose another --branch; mike would commit the built site onto it")
    exists = _git("rev-parse", "--verify", "--quiet", f"refs/heads/{branch}").returncode == 0
    if exists and _git("cat-file", "-e", f"refs/heads/{branch}:versions.json").returncode != 0:
        raise BadInput("branch is not a docs branch", where="--branch", expected="a new branch or one mike deployed to",
                       found=f"{branch!r} without versions.json at its tip",
                       fix="choose another --branch (default gh-pages)")


def _check_identity() -> None:
    """mike commits with git: git's own words when it has no identity to commit with."""
    ident = _git("var", "GIT_COMMITTER_IDENT")
    if ident.returncode != 0:
        raise Unavailable("git cannot commit here: it has no identity", where=str(ROOT),
                          found=_first_error(ident.stderr + ident.stdout),
                          fix='git config user.name "Your Name" && git config user.email you@example.com')


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
    _check_site_dir(site_dir)
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
        "branch": "the local branch mike commits to (default gh-pages; never pushed; never a checked-out branch or "
                  "a branch that is not a docs branch)",
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
    _check_name(version, "VERSION")
    if alias:
        _check_name(alias, "--alias")
    _check_branch(branch)
    if subprocess.run(["git", "rev-parse", "--git-dir"], capture_output=True, cwd=ROOT, check=False).returncode != 0:
        raise Exit(f"error: not a git repository: in {ROOT}; expected a checkout (mike commits to a branch)", code=2)
    _check_docs_branch(branch)
    _check_identity()
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
        raise Exit(f"error: no docs deployed: in --branch {branch}; expected at least one version; "
                   "fix: invoke docs.deploy VERSION --alias latest", code=2)
    _become(_mike() + ["serve", "--branch", branch, "-a", addr])
