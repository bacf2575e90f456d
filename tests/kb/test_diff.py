"""eaglekb.kb.diff and diff_render: baselines compared across git revisions, in a throwaway repo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eaglekb.io.errors import BadInput
from eaglekb.kb import baselines, diff_render
from eaglekb.kb import diff as bd
from eaglekb.measure import provenance

REPO = Path(__file__).resolve().parents[2]
NOISE = {"repeats": 3, "spread_kind": "range", "spread": {"spec_tok_s": 2.0}, "tolerance_rel": 0.02}
EXACT = {"repeats": 1, "spread_kind": "none", "tolerance_rel": 0.05}
METRICS = {"spec_tok_s": 100.0, "cycle_ms": 30.0, "accept_len": 2.0, "mem_mib": 10}
CONFIG = {"steps": [1, 2, 3], "layers": [{"n": 1}], "model": "tiny"}


@pytest.fixture(autouse=True)
def _quiet_git(monkeypatch):
    # No user git config, no GPU probe (importing torch costs seconds).
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setattr(provenance, "gpu_state", lambda: {"gpus": [], "gpu_driver": None, "cuda": None})


class Repo:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.git("init", "-q", "-b", "main")

    def git(self, *args: str) -> str:
        out = subprocess.run(["git", "-C", str(self.root), "-c", "user.name=t", "-c", "user.email=t@example.org",
                              "-c", "commit.gpgsign=false", *args], capture_output=True, text=True, check=True)
        return out.stdout.strip()

    def put(self, name: str, *, metrics=None, config=None, noise=None, kind: str = "bench", **kw) -> Path:
        b = baselines.build(kind=kind, name=name, config=CONFIG if config is None else config,
                            metrics=METRICS if metrics is None else metrics, noise=noise or NOISE,
                            command="pytest", root=self.root, created_at="2026-01-01T00:00:00Z", **kw)
        return baselines.write(b, root=self.root, force=True)

    def commit(self, message: str = "c") -> str:
        self.git("add", "-A")
        self.git("commit", "-q", "--allow-empty", "-m", message)
        return self.git("rev-parse", "HEAD")

    def diff(self, rev_a: str | None = "HEAD", rev_b: str | None = None, **kw) -> bd.DiffReport:
        return bd.diff(rev_a, rev_b, root=self.root, **kw)


@pytest.fixture
def repo(tmp_path) -> Repo:
    r = Repo(tmp_path)
    r.put("a")
    r.commit("one")
    return r


def _flags(report: bd.DiffReport, baseline_id: str = "bench/a") -> dict[str, str]:
    (change,) = [c for c in report.changes if c.id == baseline_id]
    return {m.path: m.flag for m in change.metrics}


def test_flags_follow_recorded_noise_and_direction(repo):
    repo.put("a", metrics={"spec_tok_s": 90.0, "cycle_ms": 30.5, "accept_len": 2.5, "mem_mib": 20})
    assert _flags(repo.diff()) == {
        "spec_tok_s": "regression",  # -10 tok/s, spread 2: higher is better
        "cycle_ms": "within-noise",  # +0.5 ms, 2% of 30.5 = 0.61 allowed
        "accept_len": "improvement",  # +0.5, higher is better
        "mem_mib": "changed",  # no better direction declared for MiB
    }


def test_lower_is_better_and_declared_direction(repo):
    repo.put("a", metrics={**METRICS, "cycle_ms": 25.0, "mem_mib": 20}, better={"mem_mib": "lower"})
    assert _flags(repo.diff()) == {"cycle_ms": "improvement", "mem_mib": "regression"}


def test_change_within_noise_is_not_flagged(repo):
    repo.put("a", metrics={**METRICS, "spec_tok_s": 98.5})  # spread 2.0 recorded
    report = repo.diff()
    (m,) = report.changes[0].metrics
    assert (m.old, m.new, m.delta, m.allowed, m.flag) == (100.0, 98.5, -1.5, 2.0, "within-noise")
    assert m.rel == pytest.approx(-0.015)
    assert not report.should_fail("regression")


def test_threshold_replaces_noise(repo):
    repo.put("a", metrics={**METRICS, "spec_tok_s": 90.0, "cycle_ms": 30.5})
    assert _flags(repo.diff(threshold_rel=0.2)) == {"spec_tok_s": "within-noise", "cycle_ms": "within-noise"}
    loose = repo.diff(threshold_rel=0.01)
    assert _flags(loose) == {"spec_tok_s": "regression", "cycle_ms": "regression"}
    assert {m.basis for m in loose.changes[0].metrics} == {"threshold"}
    with pytest.raises(BadInput, match="threshold"):
        repo.diff(threshold_rel=-1)


def test_fail_on_gate(repo):
    repo.put("a", metrics={**METRICS, "accept_len": 3.0})
    better = repo.diff()
    assert better.count("improvement") == 1
    assert not better.should_fail("regression") and better.should_fail("change")
    repo.put("a", metrics={**METRICS, "spec_tok_s": 50.0})
    worse = repo.diff()
    assert worse.should_fail("regression") and not worse.should_fail("none")
    with pytest.raises(BadInput, match="fail-on"):
        worse.should_fail("sometimes")


def test_list_valued_config_change_is_reported(repo):
    # dvc metrics diff ignores lists; here each item is a dotted path.
    repo.put("a", config={**CONFIG, "steps": [1, 2, 4], "layers": [{"n": 2}, {"n": 3}]})
    (change,) = repo.diff().changes
    got = {(c.path, c.change, c.old, c.new) for c in change.config}
    assert got == {("config.steps.2", "changed", 3, 4), ("config.layers.0.n", "changed", 1, 2),
                   ("config.layers.1.n", "added", None, 3)}
    assert change.metrics == [] and change.metrics_unchanged == len(METRICS)


def test_environment_changes_listed_apart_from_config(repo, monkeypatch):
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    repo.put("a")
    (change,) = repo.diff().changes
    assert change.config == []
    assert ("provenance.env.NCCL_ALGO", "added") in {(c.path, c.change) for c in change.environment}
    assert "provenance.git_commit" in {c.path for c in change.environment}


def test_added_removed_and_renamed(repo):
    repo.put("old-name", metrics={"t_tok_s": 6.0}, config={"k": 2}, noise=EXACT)
    repo.put("gone", metrics={"t_tok_s": 5.0}, config={"k": 1}, noise=EXACT)
    repo.commit("two")
    (repo.root / "baselines/bench/old-name.json").unlink()
    (repo.root / "baselines/bench/gone.json").unlink()
    repo.put("new-name", metrics={"t_tok_s": 6.0}, config={"k": 2}, noise=EXACT)
    repo.put("fresh", metrics={"t_tok_s": 7.0}, config={"k": 3}, noise=EXACT)
    report = repo.diff()
    by = {c.status: c for c in report.changes}
    assert set(by) == {"renamed", "added", "removed"} and report.unchanged == 1
    assert (by["renamed"].old_path, by["renamed"].new_path) == ("baselines/bench/old-name.json",
                                                                "baselines/bench/new-name.json")
    assert by["added"].id == "bench/fresh" and by["added"].metrics_added == {"t_tok_s": 7.0}
    assert by["removed"].id == "bench/gone" and by["removed"].metrics_removed == {"t_tok_s": 5.0}
    assert report.should_fail("change") and report.should_fail("regression")  # a deleted baseline fails both


def test_rename_with_same_config_still_compares_metrics(repo):
    (repo.root / "baselines/bench/a.json").unlink()
    repo.put("b", metrics={**METRICS, "spec_tok_s": 80.0})
    (change,) = repo.diff().changes
    assert change.status == "renamed" and _flags(repo.diff(), "bench/b") == {"spec_tok_s": "regression"}


def test_invalid_json_at_one_revision_is_a_report_line(repo):
    (repo.root / "baselines/bench/broken.json").write_text("{not json\n")
    repo.commit("broken")
    repo.put("broken", metrics={"t_tok_s": 1.0}, noise=EXACT)
    repo.put("a", metrics={**METRICS, "spec_tok_s": 50.0})
    report = repo.diff()
    (problem,) = report.problems
    assert problem.path == "baselines/bench/broken.json" and problem.revision.startswith("HEAD (")
    assert "not valid JSON" in problem.error and "\n" not in problem.line()
    assert [c.id for c in report.changes] == ["bench/a"]  # the rest is still compared
    assert report.should_fail("regression")
    assert "broken.json" in diff_render.to_markdown(report)


def test_gates_fail_on_a_baseline_unreadable_deleted_or_dangling_at_rev_b(repo):
    path = repo.root / "baselines/bench/a.json"
    good = path.read_bytes()
    for damage in (lambda: path.write_bytes(b"\xff not json"), path.unlink,
                   lambda: (path.unlink(), path.symlink_to(repo.root / "gone.json"))):
        damage()
        report = repo.diff()
        assert report.should_fail("change") and report.should_fail("regression"), report.summary()
        assert not report.should_fail("none")
        if path.is_symlink():
            assert "dangling" in report.problems[0].error
            path.unlink()
        path.write_bytes(good)
    assert not repo.diff().should_fail("change")


def test_schema_failure_names_the_field(repo):
    bad = json.loads((repo.root / "baselines/bench/a.json").read_text())
    bad["metrics"] = {"speed": 1.0}
    (repo.root / "baselines/bench/a.json").write_text(json.dumps(bad))
    (problem,) = repo.diff().problems
    assert problem.revision == "working tree" and "unit" in problem.error


def test_nonexistent_revision_is_bad_input(repo):
    with pytest.raises(BadInput) as err:
        repo.diff("xyz")
    assert "revision not found" in err.value.line() and "REV_A" in err.value.line() and "'xyz'" in err.value.line()
    with pytest.raises(BadInput, match="REV_B"):
        repo.diff("HEAD", "no-such-branch")


def test_series_compared_point_by_point(repo):
    curve = {"x": "step", "unit": "_loss", "points": {"1": 2.0, "2": 1.5, "3": 1.0}}
    repo.put("a", series={"loss": curve})
    repo.commit("curve")
    repo.put("a", series={"loss": {**curve, "points": {"1": 2.0, "2": 1.4, "3": 0.7, "4": 0.6}}})
    (s,) = repo.diff().changes[0].series
    assert (s.points_changed, s.points_added, s.points_removed, s.max_at) == (2, 1, 0, "3")
    assert s.max_abs_change == pytest.approx(0.3)


def test_default_revisions_merge_base_then_worktree(repo):
    base = repo.git("rev-parse", "HEAD")
    repo.git("checkout", "-q", "-b", "feature")
    repo.put("a", metrics={**METRICS, "spec_tok_s": 120.0})
    repo.commit("feature work")
    report = bd.diff(root=repo.root)
    assert report.commit_a == base and report.commit_b is None
    assert _flags(report) == {"spec_tok_s": "improvement"}
    repo.git("branch", "-m", "main", "trunk")  # no main: fall back to HEAD
    assert bd.diff(root=repo.root).changes == []


def test_markdown_and_json(repo):
    repo.put("a", metrics={**METRICS, "spec_tok_s": 90.0, "accept_len": 2.5}, config={**CONFIG, "steps": [1]})
    report = repo.diff()
    md = diff_render.to_markdown(report)
    assert md.startswith("## Baselines diff: HEAD (") and "**1 regression(s) ⚠️, 1 improvement(s) ✅" in md
    assert "| `spec_tok_s` | 100 | 90 | -10 | -10.00% | 2 | ⚠️ regression |" in md
    assert "<details><summary>Config changes (2)</summary>" in md and "`config.steps.1`" in md
    doc = json.loads(json.dumps(diff_render.to_json(report)))
    assert doc["counts"]["regression"] == 1 and doc["changes"][0]["metrics"][0]["path"] == "accept_len"
    assert "regression" in diff_render.to_text(report)


def test_invoke_task_gates_ci(repo):
    repo.put("a", metrics={**METRICS, "spec_tok_s": 50.0})
    env = {**os.environ, "EAGLEKB_ROOT": str(repo.root)}
    run = [sys.executable, "-m", "invoke", "--search-root", str(REPO), "baselines.diff", "--rev-a", "HEAD"]
    gated = subprocess.run([*run, "--fail-on", "regression", "--markdown"], capture_output=True, text=True,
                           env=env, cwd=repo.root)
    assert gated.returncode == 1, gated.stderr
    assert "⚠️ regression" in gated.stdout and "--fail-on regression" in gated.stderr
    report_only = subprocess.run([*run, "--json"], capture_output=True, text=True, env=env, cwd=repo.root)
    assert report_only.returncode == 0 and json.loads(report_only.stdout.splitlines()[-1])["counts"]["regression"] == 1
    missing = subprocess.run([*run[:-1], "xyz"], capture_output=True, text=True, env=env, cwd=repo.root)
    assert missing.returncode == 2 and missing.stderr.startswith("error: revision not found")
