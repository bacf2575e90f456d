"""What an agent reads: knowledge.json, llms.txt and llms-full.txt from the built site, alone.

The questions an agent asks before acting, each answered from one file of the built site and nothing else
(no baselines/, no eaglekb import), then checked against the repository: a result and the command that
reproduces it (the default drafter's current accept length per machine, prompt set and shape: one answer
each); whether a result is still current and what replaced it; which drafter, by content, a result used; a
verdict's arithmetic; a finding's status, headline and why; the next step of the game plan; the ordered
commands for a new target; and llms.txt routing to each finding with its status. The answers are derived from
whatever baselines exist (the default drafter is re-recorded from time to time), never from hard-coded numbers.
"""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers.site import ROOT

ACCEPT_KEYS = ("online.accept_len", "accept_len")


# --------------------------------------------------------------------------- the lookups (index alone)


def _accept(entry: dict) -> float | None:
    """Measured probes hold the online (runtime, bonus included) accept length; recorded ones a flat value."""
    return next((entry["metrics"][k] for k in ACCEPT_KEYS if k in entry["metrics"]), None)


def best_by_prompt_set(index: dict, drafter: str) -> dict[str, dict]:
    """From knowledge.json: per prompt set, the probe of DRAFTER with the highest accept length, the command
    that reproduces it, its noise, its pages and the findings that cite it."""
    best: dict[str, dict] = {}
    for bid, entry in index["baselines"].items():
        value = _accept(entry)
        if entry["kind"] != "probe" or value is None or entry["config"].get("drafter") != drafter:
            continue
        prompts = entry["config"]["prompts"]
        if prompts not in best or value > best[prompts]["accept_len"]:
            key = next(k for k in ACCEPT_KEYS if k in entry["metrics"])
            best[prompts] = {"baseline": bid, "accept_len": value, "command": entry["command"],
                             "allowed": entry["key_metrics"][key]["allowed"], "page": entry["page"],
                             "json": entry["json"], "host": entry["host_text"], "findings": entry["cited_by"]}
    return best


def best_accept_length_from_index(index: dict, drafter: str | None = None) -> dict | None:
    """Over all probes (of DRAFTER by config or by a word of the name, if given): the highest accept length."""
    best = None
    for bid, entry in index["baselines"].items():
        value = _accept(entry)
        if entry["kind"] != "probe" or value is None:
            continue
        if drafter and not (entry.get("config", {}).get("drafter") == drafter
                            or drafter in re.split(r"[-_./]", bid.split("/", 1)[1])):
            continue
        if best is None or value > best["accept_len"]:
            best = {"baseline": bid, "accept_len": value, "command": entry["command"], "file": entry["file"]}
    return best


_PAGE = re.compile(r"^# (probe/[a-z0-9][a-z0-9._-]*)\n(.*?)^The JSON file itself", re.M | re.S)


def _cell(page: str, key: str) -> str | None:
    m = re.search(r"^\|\s*`" + re.escape(key) + r"`\s*\|\s*(.*?)\s*\|", page, re.M)
    return m.group(1) if m else None


def best_by_prompt_set_from_llms_full(text: str, drafter: str) -> dict[str, dict]:
    """The same answer from llms-full.txt: each baseline page has its metrics table, its config table
    (rows drafter, prompts) and its provenance (`- **reproduce**: `...``)."""
    best: dict[str, dict] = {}
    for bid, page in _PAGE.findall(text):
        value = next((v for v in (_cell(page, k) for k in ACCEPT_KEYS) if v is not None), None)
        if value is None or _cell(page, "drafter") != drafter:
            continue
        prompts = _cell(page, "prompts")
        command = re.search(r"^- \*\*reproduce\*\*: `(.+?)`\s*$", page, re.M)
        if prompts not in best or float(value) > best[prompts]["accept_len"]:
            best[prompts] = {"baseline": bid, "accept_len": float(value), "command": command and command.group(1)}
    return best


# --------------------------------------------------------------------------- ground truth (the repository)


def _recorded(kind: str) -> dict[str, dict]:
    return {f"{kind}/{p.stem}": json.loads(p.read_text()) for p in sorted((ROOT / "baselines" / kind).glob("*.json"))}


def _json_accept(data: dict) -> float | None:
    m = data["metrics"]
    return m["online"]["accept_len"] if "accept_len" in m.get("online", {}) else m.get("accept_len")


def _expected_best(drafter: str) -> dict[str, tuple[str, dict]]:
    out: dict[str, tuple[str, dict]] = {}
    for bid, data in _recorded("probe").items():
        value = _json_accept(data)
        if value is None or data["config"].get("drafter") != drafter:
            continue
        prompts = data["config"]["prompts"]
        if prompts not in out or value > _json_accept(out[prompts][1]):
            out[prompts] = (bid, data)
    return out


def _front(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8").split("---\n")[1])


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def index(site):  # noqa: F811
    return json.loads((site / "knowledge.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def llms_full(site):  # noqa: F811
    return (site / "llms-full.txt").read_text(encoding="utf-8")


# --------------------------------------------------------------------------- the questions


def test_best_accept_length_of_the_default_drafter_on_each_prompt_set(index, site):
    drafter = index["defaults"]["drafter"]
    expected = _expected_best(drafter)
    assert expected, f"no probe baseline of the default drafter {drafter}"
    answer = best_by_prompt_set(index, drafter)
    assert sorted(answer) == sorted(expected)
    for prompts, (bid, data) in expected.items():
        got = answer[prompts]
        assert (got["baseline"], got["accept_len"]) == (bid, _json_accept(data)), prompts
        assert got["command"] == data["provenance"]["reproduce"] and got["command"].startswith("invoke probe")
        assert "--compare" in got["command"] and not re.search(r"--record|--force", got["command"])
        assert got["allowed"] > 0 and got["host"]
        assert (site / got["page"] / "index.html").is_file() and (site / got["json"]).is_file()
        assert json.loads((site / got["json"]).read_text()) == data
    assert index["defaults"]["probe"] in index["baselines"]


def test_the_same_answer_from_llms_full(index, llms_full):
    drafter = index["defaults"]["drafter"]
    from_index = best_by_prompt_set(index, drafter)
    from_text = best_by_prompt_set_from_llms_full(llms_full, drafter)
    assert sorted(from_text) == sorted(from_index)
    for prompts, got in from_text.items():
        assert (got["baseline"], got["command"]) == (from_index[prompts]["baseline"], from_index[prompts]["command"])
        assert got["accept_len"] == pytest.approx(from_index[prompts]["accept_len"], abs=5e-4)  # 4 digits shown


def test_best_probe_over_all_drafters(index):
    probes = {bid: d for bid, d in _recorded("probe").items() if _json_accept(d) is not None}
    bid, data = max(probes.items(), key=lambda kv: _json_accept(kv[1]))
    answer = best_accept_length_from_index(index)
    assert (answer["baseline"], answer["accept_len"]) == (bid, _json_accept(data))
    assert answer["command"] == data["provenance"]["reproduce"] and answer["file"] == f"baselines/{bid}.json"


def test_lookup_picks_the_drafter_by_config_or_name():
    entry = {"kind": "probe", "source": "measured", "file": "f", "command": "invoke probe"}
    index = {"findings": {}, "baselines": {
        "probe/other": {**entry, "metrics": {"accept_len": 3.0}, "config": {"drafter": "k2"}},
        "probe/run-7": {**entry, "metrics": {"online.accept_len": 2.1}, "config": {"drafter": "default"}},
        "probe/default-smoke": {**entry, "metrics": {"accept_len": 1.9}, "config": {}},
        "bench/default-x": {**entry, "kind": "bench", "metrics": {"accept_len": 9.0}, "config": {}},
    }}
    assert best_accept_length_from_index(index)["baseline"] == "probe/other"
    assert best_accept_length_from_index(index, drafter="default")["baseline"] == "probe/run-7"
    assert best_accept_length_from_index(index, drafter="nobody") is None


def test_why_a_finding_is_open_or_contested(index, site):
    pages = {p.stem: _front(p) for p in (ROOT / "docs/findings").glob("F*.md")}
    unsettled = {fid: f for fid, f in index["findings"].items() if f["status"] in ("open", "contested")}
    assert unsettled == {fid: index["findings"][fid] for fid, meta in pages.items()
                         if meta["status"] in ("open", "contested")}
    assert unsettled, "no open or contested finding to ask about"
    for fid, f in index["findings"].items():
        assert f["status_reason"] == pages[fid]["status_reason"] and len(f["status_reason"]) > 40, fid
        assert f["reproduce"] and all(c.startswith("invoke ") for c in f["reproduce"]), fid
        assert (site / f["page"] / "index.html").is_file(), fid
        for bid in f["evidence"]:
            urls = f["evidence_urls"][bid]
            assert (site / urls["page"] / "index.html").is_file() and (site / urls["json"]).is_file(), (fid, bid)


def test_the_next_step_of_the_game_plan(index, site):
    plan = _front(ROOT / "docs/plan.md")
    got = index["plan"]
    assert got["current_phase"] == plan["current_phase"] and got["decision_rule"] == plan["decision_rule"]
    first = got["next_steps"][0]
    assert first["title"] == plan["next_steps"][0]["title"] and first["commands"]
    assert all(c.startswith("invoke ") for step in got["next_steps"] for c in step["commands"])
    assert all(b in index["baselines"] for step in got["next_steps"] for b in step["evidence"])
    assert (site / got["page"] / "index.html").is_file()


def test_the_ordered_commands_for_a_new_target(index, site):
    recipe = index["recipes"]["new-target"]
    tasks = [s["command"].split()[1] for s in recipe["steps"]]
    assert tasks[:8] == ["plan", "models.prepare", "datagen", "vocab.build", "finetune", "inspect", "probe", "bench"]
    assert "--record" in recipe["steps"][-1]["command"]
    assert all(s["expect"] for s in recipe["steps"])
    assert (site / recipe["page"] / "index.html").is_file()
    page = html.unescape(re.sub(r"<[^>]+>", "", (site / recipe["page"] / "index.html").read_text()))
    assert all(s["command"] in page for s in recipe["steps"])


def test_agents_page_example_runs_on_the_index(site, index):
    """The Python on the agents page, run as written next to knowledge.json, answers its questions."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs/agents.md").read_text(), re.S)
    assert blocks
    out = subprocess.run([sys.executable, "-c", blocks[0]], cwd=site, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for row in current_of_default(index):
        assert f"{row['machine']} | {row['prompts']['name']} | {row['shape']}: {row['headline']}" in out.stdout
        assert row["reproduce"] in out.stdout
    assert index["plan"]["next_steps"][0]["title"] in out.stdout
    assert index["recipes"]["new-target"]["steps"][0]["command"] in out.stdout
    assert f"{index['defaults']['probe']} True" in out.stdout  # the plain probe's baseline used the default drafter
    assert "break-even 2.46 = 2.46" in out.stdout.replace("2.4599999999999995", "2.46")


def test_baselines_carry_noise_host_versions_citation(index, site):
    recorded = {f"{p.parent.name}/{p.stem}" for p in (ROOT / "baselines").glob("*/*.json")}
    assert set(index["baselines"]) == recorded
    for bid, e in index["baselines"].items():
        assert e["metrics"] and e["recorded_with"].startswith("invoke ") and e["file"] == f"baselines/{bid}.json", bid
        if e["source"] == "measured":  # the reproduce form: reruns and compares, overwrites nothing
            assert e["command"].startswith("invoke ") and not re.search(r"--record\b|--force\b", e["command"]), bid
        else:
            assert e["command"] is None, bid
        assert {"repeats", "tolerance_rel"} <= set(e["noise"]) and e["versions"] and e["host_text"], bid
        assert "None" not in e["host_text"], (bid, e["host_text"])
        assert (site / e["json"]).read_bytes() == (ROOT / e["file"]).read_bytes(), bid
        for path, km in e["key_metrics"].items():
            assert km["value"] == e["metrics"][path] and km["allowed"] >= 0 and km["better"] in ("higher", "lower")
        if e["source"] == "recorded":  # copied from a report: the host copied, the report's system measured
            assert e["citation"]["document"] and e["measured_on"] and "copied" in e["host_role"], bid
        else:
            assert e["measured_on"] is None and e["host_role"] == "measured this result", bid


def _links(text: str) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", text)


def test_llms_files_have_relative_links_that_resolve_and_no_table_padding(site, llms_full):
    site_url = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["site_url"].rstrip("/")
    for name in ("llms.txt", "llms-full.txt"):
        text = (site / name).read_text(encoding="utf-8")
        links = [u for u in _links(text) if "://" not in u and not u.startswith(("#", "mailto:", "data:"))]
        assert links, name
        assert f"]({site_url}" not in text, f"{name} links {site_url}"
        missing = sorted({u for u in links if not (site / u.split("#")[0]).exists()})
        assert not missing, f"{name} links pages that do not exist: {missing[:10]}"
    fence, padded = False, []
    for line in llms_full.splitlines():
        fence = fence != line.lstrip().startswith("```")  # literal output inside fences stays as printed
        if not fence and line.startswith("|") and re.search(r"\S {2,}\|| {2,}\S", line):
            padded.append(line)
    assert not padded, "padded table rows in llms-full.txt:\n" + "\n".join(padded[:5])
    assert "notebooks/viability/index.md" not in llms_full


def _words(text: str) -> str:
    return " ".join(re.sub(r"\\([\\`*_{}\[\]()#+\-.!|>~])", r"\1", text).split())


def test_llms_txt_and_llms_full_cover_every_finding(site, index, llms_full):  # noqa: F811
    llms = (site / "llms.txt").read_text(encoding="utf-8")
    assert llms.startswith("# ") and "knowledge.json" in llms
    full = _words(llms_full)
    for fid, f in index["findings"].items():
        assert f"findings/{fid}/" in llms, f"llms.txt does not list {fid}"
        assert _words(f["claim"]) in full, f"llms-full.txt lacks the claim of {fid}"
        for command in f["reproduce"]:
            assert _words(command) in full, f"llms-full.txt lacks the reproduce command {command!r} of {fid}"
    for bid in index["baselines"]:
        assert f"baselines/{bid}/" in llms, f"llms.txt does not list the baseline page {bid}"


def test_invoke_list_json_is_documented_and_lists_the_tasks():
    agents = (ROOT / "docs/agents.md").read_text(encoding="utf-8")
    assert "invoke --list --list-format=json" in agents
    proc = subprocess.run([sys.executable, "-m", "invoke", "--list", "--list-format=json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    listing = json.loads(proc.stdout)
    names = set()

    def walk(coll, prefix=""):
        names.update(prefix + t["name"] for t in coll["tasks"])
        for sub in coll["collections"]:
            walk(sub, prefix + sub["name"] + ".")

    walk(listing)
    assert {"plan.plan", "baselines.check", "docs.build", "docs.deploy"} <= names


# --------------------------------------------------------------------------- one answer: the current view


def current_of_default(index: dict) -> list[dict]:
    """From knowledge.json alone: the default drafter's current probe rows (one per machine, prompts, setup)."""
    sha = index["defaults"]["drafter_sha256"]
    return [r for r in index["current"] if r["kind"] == "probe" and (r["drafter"] or {}).get("sha256") == sha]


def _setup(data: dict) -> tuple:
    """A probe's setup as read from its JSON (the oracle: no eaglekb import)."""
    c, p = data["config"], data["provenance"]
    machine = p["host"]["gpus"][0]["name"] if str(c.get("device", "")).startswith("cuda") else p["host"]["cpu"]
    inputs = p.get("inputs") or {}
    return (inputs.get("drafter", {}).get("sha256"), inputs.get("target", {}).get("sha256"),
            (c.get("prompts_manifest") or {}).get("sha256") or c.get("prompts"), machine,
            *(c.get(k) for k in ("dtype", "steps", "topk", "draft_tokens", "temperature", "num_prompts",
                                 "max_new_tokens")))


def test_the_default_drafter_has_one_current_answer_per_setup(index):
    sha = index["defaults"]["drafter_sha256"]
    assert sha and re.fullmatch(r"[0-9a-f]{64}", sha)
    rows = current_of_default(index)
    assert rows, "no current probe of the default drafter"
    keys = [(r["machine"], r["prompts"]["name"], r["shape"], json.dumps(r["config"], sort_keys=True)) for r in rows]
    assert len(keys) == len(set(keys)), "two current answers for one setup"
    probes = {bid: d for bid, d in _recorded("probe").items() if d["source"] == "measured"}
    for row in rows:
        data = probes[row["baseline"]]
        assert not data.get("superseded_by") and data["provenance"]["inputs"]["drafter"]["sha256"] == sha
        rivals = [b for b, d in probes.items() if _setup(d) == _setup(data) and not d.get("superseded_by")
                  and d["created_at"] > data["created_at"]]
        assert not rivals, (row["baseline"], rivals)  # nothing newer on the same setup
        assert row["reproduce"] == data["provenance"]["reproduce"] and "--compare" in row["reproduce"]
        assert row["metrics"]["online.accept_len"] == data["metrics"]["online"]["accept_len"]
    shapes = {r["shape"] for r in rows}
    assert "chain" in shapes  # chain and tree are separate rows, never one "best"


def test_a_superseded_result_says_what_replaced_it_and_is_never_current(index, site):
    current = {r["baseline"] for r in index["current"]}
    marked = {bid for bid, d in {**_recorded("probe"), **_recorded("bench")}.items() if d.get("superseded_by")}
    assert marked and not (marked & current)
    for bid in marked:
        assert index["baselines"][bid]["superseded_by"], bid
        page = (site / index["baselines"][bid]["page"] / "index.html").read_text(encoding="utf-8")
        assert "Superseded: not a current result" in page, bid
    for row in index["current"]:
        for old in row["replaces"]:
            assert index["baselines"][old]["superseded_by"] or old in current, old


def test_every_measured_result_names_its_inputs_by_content(index):
    keys = {"drafter", "reference_drafter", "init", "target", "model", "online_target", "data", "val_data"}
    for bid, e in index["baselines"].items():
        if e["source"] != "measured":
            continue
        for key in keys & set(k for k, v in e["config"].items() if isinstance(v, str)):
            entry = e["inputs"][key]
            assert entry["path"] == e["config"][key], (bid, key)
            assert re.fullmatch(r"[0-9a-f]{64}", entry.get("sha256") or "") or entry.get("unknown"), (bid, key)
            assert entry.get("basis") or entry.get("unknown"), (bid, key)


def test_a_verdicts_arithmetic_from_the_index(index):
    """break-even = baseline tok/s x cycle time, and the chain ceiling = steps + 1, from each plan baseline."""
    plans = {bid: e for bid, e in index["baselines"].items() if e["kind"] == "plan" and "breakeven_len" in e["metrics"]}
    assert plans
    for bid, e in plans.items():
        c, m = e["config"], e["metrics"]
        if c.get("backend") == "sglang":  # plan.sglang: the two servers' timed step and cycle
            assert m["breakeven_len"] == pytest.approx(m["spec_cycle_ms"] / m["plain_step_ms"], rel=1e-6), bid
            continue
        assert m["breakeven_len"] == pytest.approx(c["baseline_tok_s"] * c["cycle_ms"] / 1000, rel=1e-6), bid
        if c.get("steps") and c.get("topk", 1) == 1:
            assert m["ceiling_len"] == c["steps"] + 1, bid


def test_llms_txt_routes_to_each_finding_with_its_status_and_the_current_view(site, index):
    llms = (site / "llms.txt").read_text(encoding="utf-8")
    assert llms.startswith("# ") and "\n> " in llms  # the llms.txt convention: title, then a summary
    for fid, f in index["findings"].items():
        line = next((l for l in llms.splitlines() if f"](findings/{fid}/index.md)" in l), None)
        assert line and line.startswith("- [") and f"**{f['status']}**" in line, fid
        assert f["headline"] and re.search(r"\d", line), fid  # a headline number on the line
        assert (site / f"findings/{fid}/index.md").is_file(), fid
    section = llms.split("## Current results", 1)[1].split("\n## ", 1)[0]
    for row in index["current"]:
        assert f"]({row['page']}index.md): " in section, row["baseline"]


def test_every_finding_is_in_the_navigation(site, index):
    nav = (site / "index.html").read_text(encoding="utf-8")
    for fid in index["findings"]:
        assert f'href="findings/{fid}/"' in nav, f"{fid} is not in the site navigation"
