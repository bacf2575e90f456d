"""The investigation's recorded numbers: re-recording them reproduces the committed baselines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from eaglekb.kb import baselines, investigation

ROOT = Path(__file__).resolve().parents[2]


def _without_created_at(path: Path) -> dict:
    doc = json.loads(path.read_text())
    doc.pop("created_at")
    return doc


def test_every_entry_is_a_valid_recorded_baseline_with_a_citation():
    made = investigation.build_all()
    assert len({b.id for b in made}) == len(investigation.ENTRIES) == 11
    for b in made:
        assert b.source == "recorded" and b.citation.section
        assert b.provenance.command == "invoke baselines.record-investigation"


def test_record_investigation_reproduces_the_committed_files(tmp_path):
    (tmp_path / "baselines").mkdir()
    (tmp_path / "mkdocs.yml").write_text("site_name: x\n")
    proc = subprocess.run([sys.executable, "-m", "invoke", "baselines.record-investigation", "--json"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "EAGLEKB_ROOT": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    ids = json.loads(proc.stdout.strip().splitlines()[-1])["baselines"]
    assert len(ids) == 11
    for baseline_id in ids:
        written = baselines.path_for(baseline_id, tmp_path)
        assert _without_created_at(written) == _without_created_at(baselines.path_for(baseline_id, ROOT))
