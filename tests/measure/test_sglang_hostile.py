"""The SGLang backend against hostile or bad input: a stale or crafted state file, a pack stopped midway, an
archive with a wheel its list does not name, a linked --out, options that would be ignored, control characters
in a URL, a taken port, a server that dies at start-up, a drafter of another shape, a prompts file's key."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import tarfile

import pytest

from eaglekb.io.errors import BadInput, Incompatible, IntegrityError, Unavailable
from eaglekb.io.pieces import check, split
from eaglekb.measure.sglang import bench as sglang_bench, stack
from eaglekb.measure.sglang.config import LaunchConfig
from eaglekb.measure.sglang.server import check_drafter, launch, process_identity, state_path, stop, wait_ready
from eaglekb.models.server import SGLangClient
from helpers.sglang_stub import serve, stub_package


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(*args, env=None):
    out = subprocess.run([sys.executable, "-m", "invoke", *args], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, **(env or {})))
    lines = [ln for ln in out.stderr.strip().splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr, (args, out.stderr)
    assert "internal error" not in lines[0], lines[0]
    return lines[0]


# ----------------------------------------------------------------------------- stop: only the server we started


@pytest.fixture
def bystander():
    """An unrelated process leading its own process group (what a stale pid may name by now)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def _state(tmp_path, port, **doc):
    path = state_path(port, tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def test_stop_refuses_a_state_file_naming_another_process(tmp_path, bystander):
    ident = process_identity(bystander.pid)
    assert ident is not None and ident["pgid"] == bystander.pid
    for wrong in ({"start_ticks": ident["start_ticks"] + 1, "cmdline": ident["cmdline"]},  # pid reused since
                  {"start_ticks": ident["start_ticks"], "cmdline": ["python", "-m", "sglang.launch_server"]},
                  {}):  # a crafted file: a pid alone
        path = _state(tmp_path, 4321, pid=bystander.pid, **wrong)
        with pytest.raises(BadInput, match="not the server our launch started") as err:
            stop(4321, state_dir=tmp_path)
        assert "nothing was signalled" in str(err.value) and "\n" not in str(err.value)
        assert bystander.poll() is None and path.is_file()  # alive, and nothing removed
    # all three match: that is the process launch recorded, and it is stopped
    _state(tmp_path, 4321, pid=bystander.pid, **ident)
    assert stop(4321, state_dir=tmp_path)["was_running"]
    assert bystander.wait(timeout=30) is not None and not state_path(4321, tmp_path).exists()


def test_stop_of_a_process_gone_removes_only_its_state(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    _state(tmp_path, 4322, pid=gone.pid, start_ticks=1, cmdline=["x"])
    res = stop(4322, state_dir=tmp_path)
    assert not res["was_running"] and not state_path(4322, tmp_path).exists()
    for bad in ({"pid": True}, {"pid": "1"}, [1]):
        path = _state(tmp_path, 4323, **bad) if isinstance(bad, dict) else state_path(4323, tmp_path)
        path.write_text(json.dumps(bad))
        with pytest.raises(BadInput, match="not ours"):
            stop(4323, state_dir=tmp_path)
        assert path.is_file()


def test_stop_cli_refuses_in_one_line(tmp_path, bystander):
    _state(tmp_path, 4324, pid=bystander.pid)
    line = _cli("sglang.stop", "--port=4324", env={"EAGLEKB_SGLANG_STATE": str(tmp_path)})
    assert "not the server our launch started" in line and bystander.poll() is None


# ----------------------------------------------------------------------------- launch: port, log, dying server


def test_launch_refuses_a_port_another_service_holds(tmp_path):
    site = stub_package(tmp_path / "site")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        with pytest.raises(BadInput, match="port already in use") as err:
            launch(LaunchConfig("/m/target", port=port), site=site, state_dir=tmp_path / "state")
    assert f"--port {port}" in str(err.value) and "\n" not in str(err.value)
    assert not state_path(port, tmp_path / "state").exists()


def test_a_failed_launch_leaves_no_state_and_each_launch_its_own_log(tmp_path):
    site = stub_package(tmp_path / "site")
    port = _free_port()
    cfg = LaunchConfig("/m/target", port=port, extra=["--stub-die"])
    for _ in range(2):
        with pytest.raises(Unavailable, match="exited during start-up") as err:
            wait_ready(launch(cfg, site=site, state_dir=tmp_path / "state"), timeout_s=30, progress=False,
                       interval_s=0.1)
        assert "CUDA out of memory (stub)" in str(err.value) and "\n" not in str(err.value)
        assert not state_path(port, tmp_path / "state").exists()  # no stale state for a later stop to trust
    log = (tmp_path / "state" / f"server-{port}.log").read_text()
    assert log.count("# launched") == 1 and log.count("stub sglang: starting") == 1


def test_launch_with_an_interpreter_that_cannot_run_is_one_line(tmp_path):
    with pytest.raises(BadInput, match="interpreter cannot run"):
        launch(LaunchConfig("/m/target", port=_free_port()), python=str(tmp_path / "no-python"),
               state_dir=tmp_path / "state")


def test_launch_refuses_a_drafter_of_another_shape(tiny_pair, tmp_path):
    from eaglekb.models.drafter import save_drafter
    from helpers.models import tiny_drafter, tiny_llama_config

    target, drafter = tiny_pair
    assert check_drafter(str(target), str(drafter)) is not None  # the matching pair passes
    wide = save_drafter(tiny_drafter(tiny_llama_config(hidden_size=64)), tmp_path / "wide")
    with pytest.raises(Incompatible, match="does not fit the target") as err:
        check_drafter(str(target), str(wide))
    assert "3 x 32" in str(err.value)
    deep = save_drafter(tiny_drafter(), tmp_path / "deep")
    cfg = json.loads((deep / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 3, 20]  # the target has 8 layers
    (deep / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(Incompatible, match="capture points"):
        check_drafter(str(target), str(deep))


def test_launch_refuses_a_p_eagle_drafter(tiny_pair, tmp_path):
    """SGLang has no parallel drafting: a P-EAGLE drafter of the right shape is refused before any launch, saying
    why (SGLang would draft it as a chain and skip its mask inputs)."""
    from eaglekb.models.drafter import save_drafter
    from eaglekb.models.parallel_drafter import to_parallel
    from helpers.models import tiny_drafter

    target, _ = tiny_pair
    parallel = save_drafter(to_parallel(tiny_drafter(), 4), tmp_path / "p-eagle")
    with pytest.raises(Incompatible, match="not one SGLang can serve") as err:
        check_drafter(str(target), str(parallel))
    assert "'p-eagle' (4 tokens in one drafter pass)" in err.value.line()
    assert "no parallel drafting" in err.value.line()


def test_options_that_would_be_ignored_are_refused():
    assert "--engine" in _cli("bench.sglang", "--device=cpu")  # --dtype alike
    assert "--drafter" in _cli("sglang.launch", "--steps=5")  # --topk, --draft-tokens alike
    assert "--plan" in _cli("bench.sglang", "--plan-variant=draft-triton")


def test_a_gpu_share_is_turned_into_a_fraction_of_the_free_memory():
    from eaglekb.measure.sglang.server import fraction_for_share

    assert fraction_for_share(0.2, 0.5) == 0.4  # a fifth of the GPU when half of it is free
    assert fraction_for_share(0.2, None) == 0.2  # no reading: the share itself
    with pytest.raises(Unavailable, match="too little free memory"):
        fraction_for_share(0.5, 0.4)
    line = _cli("sglang.launch", "--gpu-share=0.2", "--mem-fraction-static=0.3")
    assert "--gpu-share" in line and "one of them" in line


def test_a_plan_variant_the_record_never_timed_is_one_line():
    """--plan-variant picks one of the plan record's --variant servers; one it has not is refused before any request."""
    line = _cli("bench.sglang", "--engine", "--plan=plan/h100-qwen15-sglang-breakeven", "--plan-variant=draft-x",
                "--url=http://127.0.0.1:1")
    assert "--plan-variant draft-x" in line and "no such variant" in line


# ----------------------------------------------------------------------------- URLs


@pytest.mark.parametrize("url", ["http://127.0.0.1:1\x00", "http://a\tb", "http://a b", "http://h\u00e9",
                                 "http://h:port", "http://:80", "http://h:99999", "ftp://h"])
def test_bad_urls_are_refused_where_they_enter(url):
    with pytest.raises(BadInput) as err:
        SGLangClient(url, option="--plain-url")
    assert "--plain-url" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow  # the bench's imports (torch) take seconds
def test_control_characters_in_url_on_the_command_line():
    assert "--url" in _cli("bench.sglang", "--url=http://127.0.0.1:9\x01x")


# ----------------------------------------------------------------------------- prompt files and their keys


def test_prompt_sets_sharing_a_key_are_refused_before_any_request(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for d in ("a", "b"):
        (tmp_path / d / "my set.txt").write_text("one\n")
    cfg = sglang_bench.SGLangBenchConfig(url="http://127.0.0.1:9", prompts=[str(tmp_path / "a" / "my set.txt"),
                                                                            str(tmp_path / "b" / "my set.txt")])
    with pytest.raises(BadInput, match="share one result key"):  # not Unavailable: no server was asked
        sglang_bench.run(cfg, progress=False)


@pytest.mark.parametrize("what, match", [("missing.txt", "unknown prompt set"), ("short.txt", "fewer prompts")])
def test_a_bad_prompts_file_is_named_before_any_server_is_asked(tmp_path, what, match):
    (tmp_path / "short.txt").write_text("one\n")
    cfg = sglang_bench.SGLangBenchConfig(url="http://127.0.0.1:9", prompts=[str(tmp_path / what)], num_prompts=4)
    with pytest.raises(BadInput, match=match):  # not "server unreachable": the file is what the user got wrong
        sglang_bench.run(cfg, progress=False)


def test_a_prompts_file_is_keyed_by_its_name_and_recordable(tiny_pair, tmp_path):
    from eaglekb.kb import baselines

    target, _ = tiny_pair
    prompts = tmp_path / "My Prompts-1.txt"
    prompts.write_text("What is two plus two?\nName a colour.\n")
    s, url = serve({"version": "stub", "model_path": str(target)})
    try:
        rep = sglang_bench.run(sglang_bench.SGLangBenchConfig(url=url, prompts=[str(prompts)], num_prompts=2,
                                                              max_new_tokens=4, repeats=1, warmup=0,
                                                              target=str(target)), progress=False)
    finally:
        s.shutdown()
    assert list(rep.metrics) == ["my_prompts_1"]
    baselines.build(kind="bench", name="stub-prompts-file", config=rep.config, metrics=rep.metrics,
                    noise={"repeats": 1, "spread_kind": "range", "spread": rep.spread, "tolerance_rel": 0.25},
                    summary=rep.summary, command="invoke bench.sglang --prompts FILE")


# ----------------------------------------------------------------------------- pack and install


def _wheels(folder, pins):
    folder.mkdir(parents=True, exist_ok=True)
    for name, version in pins:
        (folder / f"{name}-{version}-py3-none-any.whl").write_bytes(os.urandom(3000))
    return folder


@pytest.fixture
def stack_file(tmp_path):
    path = tmp_path / "mystack.txt"
    path.write_text("foo==1.0\nbar==2.0\n")
    _wheels(tmp_path / "wheels", [("foo", "1.0"), ("bar", "2.0")])
    return path


def _hidden(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_pack_force_stopped_midway_leaves_the_old_set_whole(tmp_path, stack_file, monkeypatch):
    out = tmp_path / "pieces"
    first = stack.pack(stack_file, out, wheels_dir=tmp_path / "wheels", piece_bytes=2000, progress=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(BadInput, match="already exists"):
        stack.pack(stack_file, out, wheels_dir=tmp_path / "wheels", piece_bytes=2000, progress=False)

    def killed(src, dest, *args, **kwargs):
        (dest / "mystack.tar.part000").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(stack, "split", killed)
    with pytest.raises(KeyboardInterrupt):
        stack.pack(stack_file, out, wheels_dir=tmp_path / "wheels", piece_bytes=3000, force=True, progress=False)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert check(out / "mystack.tar.pieces.json")["sha256"] == first["sha256"]
    assert _hidden(tmp_path) == []  # no half-built set, no lock left beside it
    monkeypatch.undo()
    again = stack.pack(stack_file, out, wheels_dir=tmp_path / "wheels", piece_bytes=5000, force=True, progress=False)
    assert again["sha256"] == first["sha256"] and len(again["pieces"]) < len(first["pieces"])
    assert len(list(out.glob("*.part*"))) == len(again["pieces"]) and _hidden(tmp_path) == []


def test_pack_force_replaces_only_a_piece_folder(tmp_path, stack_file):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(BadInput, match="replaces only a piece folder"):
        stack.pack(stack_file, out, wheels_dir=tmp_path / "wheels", force=True, progress=False)
    assert (out / "notes.txt").read_text() == "keep me"
    with pytest.raises(BadInput, match="input"):
        stack.pack(stack_file, tmp_path / "wheels", wheels_dir=tmp_path / "wheels", force=True, progress=False)


def test_pack_refuses_a_linked_out(tmp_path, stack_file):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "link").symlink_to(elsewhere)
    with pytest.raises(BadInput, match="through a link"):
        stack.pack(stack_file, tmp_path / "link", wheels_dir=tmp_path / "wheels", progress=False)
    assert list(elsewhere.iterdir()) == []


def _archive(tmp_path, listed: dict, files: dict) -> object:
    """A piece set of a tar holding wheels.json (``listed``: name -> sha256) and ``files`` (name -> bytes)."""
    tar_path = tmp_path / "x.tar"
    with tarfile.open(tar_path, "w") as tar:
        for name, data in {"wheels.json": json.dumps({"stack": "x", "wheels": {
                k: {"sha256": v, "bytes": 1} for k, v in listed.items()}}).encode(), **files}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    split(tar_path, tmp_path / "pieces", 1 << 20, name="x.tar")
    return tmp_path / "pieces"


def _sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def test_install_refuses_a_wheel_its_list_does_not_name(tmp_path, monkeypatch):
    installed = []
    monkeypatch.setattr(stack, "_pip_install", lambda wheels, target: installed.append(wheels))
    good = b"a wheel"
    pieces = _archive(tmp_path, {"foo-1.0-py3-none-any.whl": _sha(good)},
                      {"foo-1.0-py3-none-any.whl": good, "evil-6.6-py3-none-any.whl": b"not listed"})
    with pytest.raises(IntegrityError, match="does not name") as err:
        stack.install(pieces, tmp_path / "site", progress=False)
    assert "evil-6.6" in str(err.value) and installed == [] and not (tmp_path / "site").exists()
    assert _hidden(tmp_path) == []


@pytest.mark.parametrize("listed, files, match", [
    ({"foo-1.0-py3-none-any.whl": "0" * 64}, {"foo-1.0-py3-none-any.whl": b"w"}, "SHA-256"),
    ({"foo-1.0-py3-none-any.whl": _sha(b"w"), "bar-1-py3-none-any.whl": _sha(b"b")},
     {"foo-1.0-py3-none-any.whl": b"w"}, "missing"),
    ({}, {}, "not a wheel list"),
])
def test_install_refuses_a_set_that_does_not_match_its_list(tmp_path, monkeypatch, listed, files, match):
    installed = []
    monkeypatch.setattr(stack, "_pip_install", lambda wheels, target: installed.append(wheels))
    with pytest.raises(IntegrityError, match=match):
        stack.install(_archive(tmp_path, listed, files), tmp_path / "site", progress=False)
    assert installed == [] and not (tmp_path / "site").exists()


def test_pack_then_install_installs_exactly_the_listed_wheels(tmp_path, stack_file, monkeypatch):
    installed = []

    def fake_pip(wheels, target):
        installed.extend(w.name for w in wheels)
        target.mkdir(parents=True)

    monkeypatch.setattr(stack, "_pip_install", fake_pip)
    stack.pack(stack_file, tmp_path / "pieces", wheels_dir=tmp_path / "wheels", piece_bytes=2000, progress=False)
    (tmp_path / "pieces" / "stray-9-py3-none-any.whl").write_bytes(b"beside the pieces, not in the set")
    doc = stack.install(tmp_path / "pieces", tmp_path / "site", progress=False)
    assert sorted(installed) == ["bar-2.0-py3-none-any.whl", "foo-1.0-py3-none-any.whl"]
    assert doc["wheels_count"] == 2 and (tmp_path / "site" / stack.STAMP).is_file()
    (tmp_path / "link").symlink_to(tmp_path / "site")
    with pytest.raises(BadInput, match="through a link"):
        stack.install(tmp_path / "pieces", tmp_path / "link", force=True, progress=False)


# ----------------------------------------------------------------------------- wording


def test_offline_install_speaks_of_the_users_hosts_only():
    from pathlib import Path

    import eaglekb.measure.sglang as pkg

    root = Path(__file__).resolve().parents[2]
    files = [*Path(pkg.__file__).parent.glob("*.py"), root / "runbooks" / "sglang.py",
             root / "src" / "eaglekb" / "models" / "server.py"]
    for f in files:
        text = f.read_text().lower()
        for word in ("64 mib", "$out", ".carry", "lent machine", "a call", "between calls", "device time",
                     "fits a transfer", "air-gapped"):
            assert word not in text, (f.name, word)
