"""Files as git history holds them: listing a path at a commit, hashing its blobs, reading logs.

Owns ``Git``: one repository's history, read through ``git`` (``eaglekb.kb.diff``'s runner): the blobs of a
path's identifying files at a commit (``blobs``, the same files ``eaglekb.measure.provenance`` hashes at run
time), their sha256 (``sha``: each blob written to a temporary folder and hashed with ``eaglekb.io.pieces``,
once per blob), and any git command's text output (``text``). Knows nothing about baselines.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from eaglekb.io.pieces import sha256_file, sha256_files
from eaglekb.kb.diff import _git
from eaglekb.measure import provenance as prov


class Git:
    """Reads of one repository's history, cached (blob hashes by blob id)."""

    def __init__(self, root: Path):
        self.root = root
        self.ok = _git(root, "rev-parse", "--git-dir").returncode == 0
        self._sha: dict[tuple[str, ...], str] = {}

    def text(self, *args: str) -> str | None:
        out = _git(self.root, *args)
        return out.stdout.decode("utf-8", "replace") if out.returncode == 0 else None

    def blobs(self, commit: str, path: str, role: str) -> dict[str, str] | None:
        """File name -> blob id of the identifying files of PATH at COMMIT (None: not tracked there)."""
        listing = self.text("ls-tree", commit, "--", path.rstrip("/") + "/") or self.text("ls-tree", commit, "--", path)
        if not listing:
            return None
        entries = {}
        for line in listing.splitlines():
            meta, _, name = line.partition("\t")
            parts = meta.split()
            if len(parts) == 3 and parts[1] == "blob":
                entries[name.rsplit("/", 1)[-1]] = parts[2]
        if len(entries) == 1 and listing.split("\t", 1)[-1].strip() == path:  # a single file
            return entries
        names = prov.role_files(role if role in prov.ROLE_FILES else "drafter", list(entries))
        return {n: entries[n] for n in names} or None

    def sha(self, blobs: dict[str, str]) -> tuple[str, dict[str, str]]:
        """(sha256 of the blobs read in order, name -> sha256 of each), each blob read from git once."""
        key = tuple(blobs.values())
        if key not in self._sha or any((blob,) not in self._sha for blob in key):
            with tempfile.TemporaryDirectory(prefix="eaglekb-identity-") as tmp:
                files = []
                for i, blob in enumerate(key):
                    path = Path(tmp) / f"{i:02d}"
                    path.write_bytes(_git(self.root, "cat-file", "blob", blob).stdout)
                    files.append(path)
                    self._sha[(blob,)] = sha256_file(path)
                self._sha[key] = sha256_files(files)
        return self._sha[key], {name: self._sha[(blob,)] for name, blob in blobs.items()}
