"""MkDocs build hooks: render baselines/ JSON into the site and fail on bad citations.

Numbers on the site come only from baselines/*.json. Pages use placeholders
that these hooks replace; an unknown placeholder, a baseline id that does not
exist, a metric that is not in the baseline, or a finding without evidence
stops the build with one line (PluginError).

Placeholders (in any Markdown page):
  {{ metric KIND/NAME PATH }}   one metric, formatted, with its spread
  {{ cite KIND/NAME }}          a link to the baseline's page
  {{ table KIND/NAME }}         the baseline's metric table
  {{ plot KIND/NAME [SERIES] }} an SVG plot generated at build time
  {{ overlay SERIES ID ID ... }} one series of several baselines in one SVG (inline)
  {{ finding ID }}              a link to a finding with its status
  {{ baselines_index }}         every baseline, linked
  {{ findings_index }}          every finding with status and evidence
  {{ commands }}                every invoke task with its options (from tasks.py)
  {{ schema }}                  the baseline schema reference
  {{ version }}                 eaglekb version and the git commit of baselines/
  {{ next_steps }}              the game plan's next steps with their commands (docs/plan.md front matter)
  {{ recipe ID }}               a recipe's ordered steps: command and expected output (a page's front matter)
  {{ config KIND/NAME PATH }}   one config value of a baseline (a setting, such as the plan's cycle_ms)
  {{ current [default] }}       the current view: newest result per setup (default: the default drafter's)
  {{ quote TEXT }}              a figure quoted as written (a goal or budget, not a result), let through the
                                hand-typed figure check of the present-state pages

Pages that state the project's present numbers (eaglekb.kb.pages.PRESENT_PAGES: home, agents, plan) take every
figure from a placeholder, and none of their placeholders may present a superseded result (the build fails
with one line naming the page). Findings appear in the navigation on their own: every findings/F*.md after
findings/index.md, in order; a finding missing from it fails the build.

Also generated: knowledge.json (findings, baselines, plan, recipes; see eaglekb.kb.knowledge), a copy of
every baseline JSON file beside its page, and llms.txt / llms-full.txt rewritten after the llmstxt
plugin (relative links, no table padding).
"""

from __future__ import annotations

import base64
import json
import os
import posixpath
import re
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("EAGLEKB_ROOT", str(ROOT))

from eaglekb import __version__  # noqa: E402
from eaglekb.kb import render  # noqa: E402
from eaglekb.kb import breakeven_plot  # noqa: E402
from eaglekb.kb import baselines as bl
from eaglekb.kb import current as cv
from eaglekb.kb import diff
from eaglekb.kb import knowledge
from eaglekb.kb import pages
from eaglekb.measure.setup import DEFAULT_DRAFTER  # noqa: E402
from eaglekb.models.sources import DEFAULT_TARGET  # noqa: E402
from eaglekb.io.errors import EaglekbError  # noqa: E402

PLACEHOLDER = re.compile(r"\{\{\s*([a-z_]+)((?:\s+[^\s{}]+)*)\s*\}\}")
STATE: dict = {}


def _fail(exc: EaglekbError | str) -> PluginError:
    return PluginError(f"eaglekb: {exc.line() if isinstance(exc, EaglekbError) else exc}")


def on_config(config):
    docs = Path(config["docs_dir"])
    try:
        STATE["baselines"] = bl.load_all(ROOT, current=True)
        STATE["current"] = cv.view(STATE["baselines"])
        STATE["superseded"] = cv.superseded(STATE["baselines"], STATE["current"])
        STATE["findings"] = knowledge.load_findings(docs / "findings")
        _nav_findings(config, sorted(STATE["findings"]))
        STATE["plan"] = knowledge.load_plan(docs / "plan.md")
        STATE["recipes"] = knowledge.load_recipes(docs)
        knowledge.check_evidence(STATE["findings"], STATE["baselines"], STATE["plan"])
    except EaglekbError as exc:
        raise _fail(exc) from None
    STATE["plots"] = {}
    if not os.environ.get("MIKE_DOCS_VERSION"):
        # Not built by mike (`invoke docs.deploy`): no versions.json exists beside this site, so the version
        # selector would only ask for it and log a 404 on every page. Versioned builds keep the selector.
        (config.get("extra") or {}).pop("version", None)
    return config


def _nav_findings(config, ids: list[str]) -> None:
    """The Findings section of the navigation, at any depth: its index, then every finding page in order (no
    hand-kept list)."""
    def fill(entries) -> None:
        for entry in entries or []:
            if isinstance(entry, dict):
                for title, value in entry.items():
                    if title == "Findings":
                        entry[title] = ["findings/index.md", *(f"findings/{fid}.md" for fid in ids)]
                    elif isinstance(value, list):
                        fill(value)

    fill(config.get("nav"))


def on_nav(nav, config, files):
    listed = {page.file.src_uri for page in nav.pages}
    for fid in sorted(STATE["findings"]):
        if f"findings/{fid}.md" not in listed:
            raise _fail(EaglekbError("finding is not in the site navigation", where=f"docs/findings/{fid}.md",
                                     expected="a Findings section in mkdocs.yml nav (filled in by the build)",
                                     found="no nav entry"))
    return nav


def _default_drafter_sha() -> str | None:
    """The default drafter's content hash: its files here, else as git holds them (they may be away)."""
    from eaglekb.kb.history import Git
    from eaglekb.measure import provenance as prov

    found = prov.input_identity("drafter", DEFAULT_DRAFTER, ROOT)
    if found.get("sha256"):
        return found["sha256"]
    git = Git(ROOT)
    blobs = git.blobs("HEAD", DEFAULT_DRAFTER, "drafter") if git.ok else None
    return git.sha(blobs)[0] if blobs else None


def _headline(f) -> str | None:
    """A finding's headline number (its own, placeholders rendered), else its first evidence's summary."""
    if f.headline:
        return f.headline
    first = STATE["baselines"].get(f.evidence[0])
    return f"{first.id}: {first.summary}" if first is not None and first.summary else None


def _page_path(bid: str) -> str:
    return f"baselines/{bid}.md"


def _plot_path(bid: str, series: str | None) -> str:
    slug = bid.replace("/", "-") + (f"-{series}" if series else "")
    return f"assets/plots/{slug}.svg"


def _plot_svg(baseline, series: str | None) -> str:
    if series:
        if series not in baseline.series:
            raise EaglekbError("series not found", where=baseline.id, expected=", ".join(baseline.series) or "none", found=series)
        return render.series_svg(baseline, series)
    if baseline.kind == "plan":
        return breakeven_plot.plan_svg(baseline)
    raise EaglekbError("no default plot for this kind", where=baseline.id, expected="a plan baseline or a SERIES name", found=baseline.kind)


#: Plots drawn per baseline (its plan plot and first series): a baseline with thousands of series
#: must not turn into thousands of files.
MAX_PLOTS = 24


def _default_plots(baseline) -> list[str | None]:
    plots: list[str | None] = list(baseline.series)[:MAX_PLOTS]
    if baseline.kind == "plan" and ("breakeven_len" in baseline.metrics or breakeven_plot.is_curve(baseline)):  # one plan
        plots.insert(0, None)
    return plots


@event_priority(50)  # before plugins (llmstxt expands its globs in on_files): they see the generated pages
def on_files(files, config):
    try:
        for bid, baseline in STATE["baselines"].items():
            rels = []
            for series in _default_plots(baseline):
                path = _plot_path(bid, series)
                files.append(File.generated(config, path, content=_plot_svg(baseline, series)))
                STATE["plots"][(bid, series)] = path
                rels.append(posixpath.relpath(path, posixpath.dirname(_page_path(bid))))
            page = render.baseline_page(baseline, rels, STATE["superseded"].get(bid)) + \
                f"\nThe JSON file itself: [{baseline.name}.json]({baseline.name}.json).\n"
            files.append(File.generated(config, _page_path(bid), content=page))
            # The baseline file as it is in baselines/, published beside its page (knowledge.json links it).
            files.append(File.generated(config, knowledge.baseline_urls(bid)["json"],
                                        content=bl.read_text(bl.path_for(bid, ROOT))))
        STATE["default_sha"] = _default_drafter_sha()
        defaults = {"target": DEFAULT_TARGET, "drafter": DEFAULT_DRAFTER, "probe": f"probe/{_default_probe()}",
                    "drafter_sha256": STATE["default_sha"]}
        plan = STATE["plan"].model_copy(update={"next_steps": [s.model_copy(update={
            "title": _plain(s.title, "plan.md: next_steps"), "why": _plain(s.why, "plan.md: next_steps")})
            for s in STATE["plan"].next_steps]})
        findings = {fid: f.model_copy(update={"headline": _plain(f.headline, f.page) if f.headline else _headline(f),
                                              "claim": _plain(f.claim, f.page)})
                    for fid, f in STATE["findings"].items()}
        STATE["plain_findings"] = findings
        index = knowledge.index(findings, STATE["baselines"], plan, STATE["recipes"], defaults,
                                STATE["current"], STATE["superseded"])
        files.append(File.generated(config, "knowledge.json", content=json.dumps(index, indent=2, sort_keys=True) + "\n"))
    except EaglekbError as exc:
        raise _fail(exc) from None
    return files


def _default_probe() -> str:
    """The baseline `invoke probe` with no arguments compares itself with (runbooks/probe.py)."""
    sys.path.insert(0, str(ROOT))
    from runbooks.probe import DEFAULT_RECORD  # noqa: PLC0415 - the docs tool may import the runbooks

    return DEFAULT_RECORD


def _link(page_uri: str, target: str) -> str:
    return posixpath.relpath(target, posixpath.dirname(page_uri) or ".")


def _baseline(bid: str, where: str):
    if bid not in STATE["baselines"]:
        raise EaglekbError("page cites a baseline that does not exist", where=where,
                           expected="an id listed by `invoke baselines.check`", found=bid)
    return STATE["baselines"][bid]


def _finding_box(f: knowledge.Finding, page_uri: str) -> str:
    evidence = ", ".join(f"[{bid}]({_link(page_uri, _page_path(bid))})" for bid in f.evidence)
    kind = {"confirmed": "success", "refuted": "failure", "open": "question",
            "contested": "warning", "superseded": "note"}[f.status]
    return "\n".join([
        f"# {f.id}: {render.safe(f.title, 500)}", "",
        f'!!! {kind} "Status: {f.status}"',
        f"    **Claim.** {_kept(f.claim, 5000)}", "",
        *([f"    **Headline.** {render.safe(_plain(f.headline, f.page), 1000)}", ""] if f.headline else []),
        f"    **Scope.** {render.safe(f.scope, 5000)}", "",
        f"    **Why {f.status}.** {render.safe(f.status_reason, 5000)}", "",
        f"    **Evidence.** {evidence}", "",
        "    **Reproduce** (in order):", "",
        "    ```bash", *[f"    {cmd}" for cmd in f.reproduce], "    ```", "",
    ])


def _findings_index(page_uri: str) -> str:
    rows = ["| finding | status | claim | evidence |", "|---|---|---|---|"]
    for fid, f in sorted(STATE["findings"].items()):
        link = _link(page_uri, f"findings/{fid}.md")
        ev = ", ".join(f"[{b}]({_link(page_uri, _page_path(b))})" for b in f.evidence)
        rows.append(f"| [{fid}: {render.safe(f.title, 500)}]({link}) | **{f.status}** | "
                    f"{render.safe(_plain(f.claim, f.page), 5000)} | {ev} |")
    return "\n".join(rows)


def _commands() -> str:
    sys.path.insert(0, str(ROOT))
    import tasks  # noqa: PLC0415 - the docs tool may import the runbooks; the library may not

    out = []
    def walk(coll, prefix):
        for name in sorted(coll.tasks):
            t = coll.tasks[name]
            full = prefix + name
            default = coll.default == name
            title = f"invoke {prefix.rstrip('.')}" if default and prefix else f"invoke {full}"
            out.append(f"### `{title}`\n")
            out.append((t.__doc__ or t.body.__doc__ or "").strip() + "\n")
            params = [p for p in t.help] if t.help else []
            if params:
                out.append("| option | help |\n|---|---|")
                for p in params:
                    out.append(f"| `--{p.replace('_', '-')}` | {_table_cell(t.help[p])} |")
                out.append("")
        for cname in sorted(coll.collections):
            walk(coll.collections[cname], prefix + cname + ".")
    walk(tasks.ns, "")
    return "\n".join(out)


def _table_cell(text: str) -> str:
    """Text for one Markdown table cell: a ``|`` escaped (it would end the cell), on one line."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _rich(text: str, page, limit: int) -> str:
    """Front-matter text for a page: its placeholders rendered, everything else escaped as data."""
    out, last = [], 0
    for m in PLACEHOLDER.finditer(text):
        out += [render.safe(text[last:m.start()], limit) if m.start() > last else "", _replace(m, page)]
        last = m.end()
    return "".join(out) + (render.safe(text[last:], limit) if last < len(text) else "")


def _kept(text: str, limit: int) -> str:
    """Front-matter text placed in a page before its placeholders are replaced (a finding's claim): everything
    escaped as data except the placeholders, which the page's own pass then renders."""
    out, last = [], 0
    for m in PLACEHOLDER.finditer(text):
        out += [render.safe(text[last:m.start()], limit) if m.start() > last else "", m.group(0)]
        last = m.end()
    return "".join(out) + (render.safe(text[last:], limit) if last < len(text) else "")


def _plain(text: str | None, where: str | None) -> str | None:
    """Front-matter text for knowledge.json and llms.txt: placeholders as plain values (metric, config, cite,
    finding, quote); any other placeholder is refused."""
    if text is None:
        return None

    def one(m: re.Match) -> str:
        name, args = m.group(1), m.group(2).split()
        at = f"{where}: {m.group(0)}"
        if name in ("metric", "config") and len(args) == 2:
            return (render.metric_text(_baseline(args[0], at), args[1]) if name == "metric"
                    else render.config_text(_baseline(args[0], at), args[1], at))
        if name == "cite" and len(args) == 1:
            return _baseline(args[0], at).id
        if name == "finding" and len(args) == 1 and args[0] in STATE["findings"]:
            return f"{args[0]} ({STATE['findings'][args[0]].status})"
        if name == "quote" and args:
            return " ".join(args)
        raise EaglekbError("placeholder not allowed in front matter text", where=at,
                           expected="metric, config, cite, finding or quote", found=name)

    return PLACEHOLDER.sub(one, text)


def _next_steps(page) -> str:
    """The game plan's next steps (docs/plan.md front matter), numbered, each with its commands."""
    page_uri = page.file.src_uri
    out = []
    for i, step in enumerate(STATE["plan"].next_steps, 1):
        cites = ", ".join(f"[{b}]({_link(page_uri, _page_path(b))})" for b in step.evidence)
        out += [f"{i}. **{_rich(step.title, page, 500)}** {_rich(step.why, page, 2000)}"
                + (f" Builds on {cites}." if cites else ""), "",
                "    ```bash", *[f"    {c}" for c in step.commands], "    ```", ""]
    return "\n".join(out)


def _recipe(rid: str, where: str) -> str:
    """A recipe's steps (a how-to page's front matter), each a command with the shape of its output."""
    recipe = STATE["recipes"].get(rid)
    if recipe is None:
        raise EaglekbError("no such recipe", where=where, expected="one of " + ", ".join(sorted(STATE["recipes"])),
                           found=rid)
    out = []
    for i, step in enumerate(recipe.steps, 1):
        out += [f"### {i}. {render.safe(step.step, 200)}", "", "```bash", step.command, "```", ""]
        if step.alternative:
            out += ["Or:", "", "```bash", step.alternative, "```", ""]
        out += [f"**Expect.** {step.expect}", ""]
    return "\n".join(out)


def _replace(match: re.Match, page) -> str:
    name, args = match.group(1), match.group(2).split()
    uri = page.file.src_uri
    where = f"{uri}: {match.group(0)}"

    def need(n):
        if len(args) != n:
            raise EaglekbError("placeholder takes %d argument(s)" % n, where=where, found=str(len(args)))

    if name == "metric":
        need(2)
        return render.metric_text(_baseline(args[0], where), args[1])
    if name == "cite":
        need(1)
        _baseline(args[0], where)
        return f"[{args[0]}]({_link(uri, _page_path(args[0]))})"
    if name == "table":
        need(1)
        return render.metrics_table(_baseline(args[0], where))
    if name == "plot":
        if len(args) not in (1, 2):
            raise EaglekbError("placeholder takes 1 or 2 arguments", where=where, found=str(len(args)))
        series = args[1] if len(args) == 2 else None
        key = (args[0], series)
        _baseline(args[0], where)
        if key not in STATE["plots"]:
            raise EaglekbError("no such plot", where=where, expected="a plan baseline or one of its series", found=" ".join(args))
        return f"![{' '.join(args)}]({_link(uri, STATE['plots'][key])})"
    if name == "overlay":
        if len(args) < 3:
            raise EaglekbError("placeholder takes a SERIES and at least two baseline ids", where=where,
                               found=str(len(args)))
        svg = render.overlay_svg([_baseline(a, where) for a in args[1:]], args[0])
        data = base64.b64encode(svg.encode()).decode()
        return f"![{args[0]}: {', '.join(args[1:])}](data:image/svg+xml;base64,{data})"
    if name == "finding":
        need(1)
        f = STATE["findings"].get(args[0])
        if f is None:
            raise EaglekbError("page cites a finding that does not exist", where=where,
                               expected="one of " + ", ".join(sorted(STATE["findings"])), found=args[0])
        return f"[{f.id}: {render.safe(f.title, 500)}]({_link(uri, f'findings/{f.id}.md')}) (**{f.status}**)"
    if name == "baselines_index":
        need(0)
        return render.index_table(STATE["baselines"], lambda bid: _link(uri, _page_path(bid)))
    if name == "findings_index":
        need(0)
        return _findings_index(uri)
    if name == "commands":
        need(0)
        return _commands()
    if name == "schema":
        need(0)
        return render.schema_reference()
    return _replace_more(name, args, where, page)


def _replace_more(name: str, args: list[str], where: str, page) -> str:
    """The placeholders of the game plan and the current view (``_replace`` handles the others)."""
    uri = page.file.src_uri

    def need(n):
        if len(args) != n:
            raise EaglekbError("placeholder takes %d argument(s)" % n, where=where, found=str(len(args)))

    if name == "next_steps":
        need(0)
        return _next_steps(page)
    if name == "config":
        need(2)
        return render.safe(render.config_text(_baseline(args[0], where), args[1], where))
    if name == "quote":
        if not args:
            raise EaglekbError("placeholder takes the quoted text", where=where, found="nothing")
        return render.safe(" ".join(args))
    if name == "current":
        if args not in ([], ["default"]):
            raise EaglekbError("placeholder takes nothing or 'default'", where=where, found=" ".join(args))
        rows = STATE["current"]
        if args:
            sha = STATE.get("default_sha")
            rows = [r for r in rows if (r["drafter"] or {}).get("sha256") == sha or (
                r["drafter"] is None and (r["target"] or {}).get("path") == DEFAULT_TARGET)]
        return cv.table(rows, lambda bid: _link(uri, _page_path(bid)))
    if name == "recipe":
        need(1)
        return _recipe(args[0], where)
    if name == "version":
        need(0)
        docs = os.environ.get("MIKE_DOCS_VERSION")  # set by mike (`invoke docs.deploy`)
        return (f"eaglekb {__version__}" + (f" (docs version {docs})" if docs else "")
                + f", baselines at commit {diff.last_commit(ROOT, 'baselines')}")
    raise EaglekbError("unknown placeholder", where=where, expected="one of the names in docs/hooks/eaglekb_hooks.py", found=name)


@event_priority(-100)  # after the llmstxt plugin has written llms.txt and llms-full.txt
def on_post_build(config):
    """llms.txt and llms-full.txt with links relative to the site root (no hard-wired host), no link to a
    missing ``index.md`` (a notebook page has none), and tables without column padding."""
    site = Path(config["site_dir"])
    plugin = config["plugins"].get("llmstxt")
    bases = [config.get("site_url") or "", getattr(plugin, "_base_url", "") or ""]
    pages = [p for p in site.rglob("index.md") if (p.parent / "index.html").is_file()]  # the plugin's copies
    llms = site / "llms.txt"
    if llms.is_file():
        findings = [knowledge.finding_line(f, _headline(f)) for f in STATE["plain_findings"].values()]
        llms.write_text(knowledge.llms_txt(llms.read_text(encoding="utf-8"), findings,
                                           [knowledge.current_line(r) for r in STATE["current"]]), encoding="utf-8")
    for path in [site / "llms.txt", site / "llms-full.txt", *pages]:
        if path.is_file():
            folder = path.parent.relative_to(site).as_posix() if path.name == "index.md" else ""
            text = knowledge.agent_text(path.read_text(encoding="utf-8"), bases, lambda rel: (site / rel).is_file(),
                                        "" if folder == "." else folder)
            path.write_text(text, encoding="utf-8")


def _check_present(markdown: str, page) -> None:
    """A page that states present numbers: no hand-typed figure, no placeholder presenting a superseded result."""
    uri = page.file.src_uri
    texts = [("", markdown)]
    if uri == "plan.md":
        plan = STATE["plan"]
        texts += [("current_phase", plan.current_phase), ("decision_rule", plan.decision_rule)]
        texts += [(f"next_steps[{i}]", f"{s.title} {s.why}") for i, s in enumerate(plan.next_steps, 1)]
    for field, text in texts:
        for line, figure in pages.hand_typed_figures(text):
            at = f"docs/{uri}:{line}" if not field else f"docs/{uri}: front matter {field}"
            raise EaglekbError("hand-typed figure on a page that states present numbers", where=at,
                               expected="every figure from a baseline ({{ metric ... }}, {{ config ... }}) or "
                               "{{ quote ... }} for a goal as written", found=repr(figure))
        for m in PLACEHOLDER.finditer(text):
            name, args = m.group(1), m.group(2).split()
            if name in ("metric", "cite", "table", "plot") and args:
                why = pages.stale(args[0], args[1] if name == "metric" and len(args) > 1 else None,
                                  STATE["baselines"], STATE["current"], STATE["superseded"])
                if why:
                    raise EaglekbError("page presents a superseded result as current", where=f"docs/{uri}: "
                                       f"{m.group(0)}", expected="the current result ({{ current }})",
                                       found=f"superseded: {why}")


def on_page_markdown(markdown, page, config, files):
    try:
        if page.file.src_uri in pages.PRESENT_PAGES:
            _check_present(markdown, page)
        if page.file.src_uri.startswith("findings/F"):
            f = knowledge.parse_finding(page.meta, page.file.src_uri)
            # Material reads `status` as its own page-status marker (an icon in the nav): keep ours apart.
            page.meta["finding_status"] = page.meta.pop("status")
            markdown = _finding_box(f, page.file.src_uri) + "\n" + markdown
        return PLACEHOLDER.sub(lambda m: _replace(m, page), markdown)
    except EaglekbError as exc:
        raise _fail(exc) from None
