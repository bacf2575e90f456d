"""Fixtures shared across the test packages (plain helpers live in tests/helpers/)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers import background
from helpers.models import tiny_drafter, tiny_llama_config, write_tiny_target
from helpers.planted import planted_job
from helpers.site import built_site, site_job


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread: several times faster on a shared, loaded CPU; restored afterwards.
    A module uses it for all its tests with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``
    by name."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    from eaglekb.models.drafter import save_drafter

    base = tmp_path_factory.mktemp("probe")
    target = write_tiny_target(base / "target")
    drafter = save_drafter(tiny_drafter(tiny_llama_config(), dtype="float32"), base / "drafter")
    return target, drafter


@pytest.fixture(scope="session")
def checkout_producers():
    """``runbooks._dryrun.Producers`` of this checkout: what every recorded command (each baseline's), finding's
    reproduce command, recipe step and documented command writes, and what git tracks. Parsing those few hundred
    commands with invoke's parser takes seconds; tests/test_recorded_commands.py and tests/kb/test_one_truth.py
    read the same set, built once."""
    import json

    import tasks
    from eaglekb.kb import knowledge
    from runbooks import _dryrun

    root = Path(__file__).resolve().parents[1]
    commands = [*(json.loads(p.read_text())["provenance"]["command"] for p in sorted((root / "baselines").glob("*/*.json"))),
                *(c for f in knowledge.load_findings(root / "docs/findings").values() for c in f.reproduce),
                *(s.command for r in knowledge.load_recipes(root / "docs").values() for s in r.steps),
                *_dryrun.documented_commands(root / "docs")]
    return _dryrun.Producers(tasks.ns, commands, root)


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    """The built site folder (one strict build per test session)."""
    return built_site(tmp_path_factory)


SITE_TESTS = Path(__file__).resolve().parent / "site"
#: Site modules that run first among the site tests: they need only the checkout's build (the first job after the
#: story's), so the builds still left run beside their Chromium work; the deploy the browser module ends with is
#: queued right after that build, as its tests come first.
SITE_FIRST = ("test_agents_lookup.py", "test_site_outputs.py", "test_site_browser.py")


def pytest_collection_modifyitems(config, items):
    """The site tests (tests/site/) run last, each module kept whole and in its order (``SITE_FIRST`` first): the
    builds they wait for (``_background_jobs``) then run beside all the other tests instead of holding them up."""
    def rank(item) -> int:
        path = Path(str(item.path)).resolve()
        if SITE_TESTS not in path.parents:
            return 0
        return 1 + (SITE_FIRST.index(path.name) if path.name in SITE_FIRST else len(SITE_FIRST))

    if any(rank(item) for item in items):
        items[:] = sorted(items, key=rank)  # stable: the order within each part is kept


@pytest.fixture(scope="session", autouse=True)
def _background_jobs(request, tmp_path_factory):
    """Start the expensive builds the selected tests need when the run begins, in the order the tests need them
    (helpers/background.py): the checkout's site build (fixture ``site``), the planted copy's (``planted_site``,
    tests/site/conftest.py), and what a test module's ``background_job(item)`` names for one of its tests: None,
    or (key, make), ``make(tmp_path_factory)`` giving the job's function (once per key). They run one at a time
    beside the tests; what is left at the end of the run is stopped."""
    jobs: dict[str, object] = {}
    for item in request.session.items:
        if item.get_closest_marker("skip"):  # a module skipped as a whole (no Chromium) needs no build
            continue
        names = getattr(item, "fixturenames", ())
        if "site" in names and "site" not in jobs:
            jobs["site"] = site_job(tmp_path_factory)
        if "planted_site" in names and "planted" not in jobs:
            jobs["planted"] = planted_job(tmp_path_factory)
        hook = getattr(getattr(item, "module", None), "background_job", None)
        job = hook(item) if hook else None
        if job is not None and job[0] not in jobs:
            key, make = job
            jobs[key] = make(tmp_path_factory)
    background.start(list(jobs.items()))
    yield
    background.stop()
