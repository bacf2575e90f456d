"""An SGLang server started and stopped by our tasks: launch, wait for health, server_info, stop by pid.

Owns ``launch`` (``python -m sglang.launch_server`` built by ``eaglekb.measure.sglang.config.launch_command``,
run in its own process session so that it outlives the task that started it, its output in a log
file begun afresh by each launch, the serving stack's folder first on its ``PYTHONPATH`` only; a port
another service holds is refused before anything starts; a state file per port records the pid, the
process's start time and command line (from ``/proc``), the log and server_info), ``check_drafter`` (a
drafter whose hidden size, vocabulary or aux layers do not fit the target is refused before launching),
``wait_ready`` (``/health`` polled with a timeout and a progress line; a server that exits during
start-up is refused with one line naming its last log lines) and ``stop`` (SIGTERM to the process
group a state file names, SIGKILL after a grace period, and only while pid, start time and command
line all still match what launch recorded: a stale or crafted state file signals nothing). Knows
nothing about benchmarks or the task runner.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import signal
import subprocess
import sys
import time
from pathlib import Path

from eaglekb.formats.inspect import inspect_checkpoint
from eaglekb.io.errors import BadInput, Incompatible, MissingFile, Unavailable, one_line
from eaglekb.io.files import atomic_write_json, process_alive, read_json
from eaglekb.measure.setup import check_drafter_fits
from eaglekb.measure.sglang.config import LaunchConfig, command_line, launch_command
from eaglekb.models import sources
from eaglekb.models.server import SGLangClient

#: where launch keeps a state file and a log per port (``EAGLEKB_SGLANG_STATE`` overrides: a folder outside the
#: working tree, say, where the tree is replaced while a server runs)
STATE_DIR = Path(os.environ.get("EAGLEKB_SGLANG_STATE") or Path(".eaglekb") / "sglang")
SERVER_INFO_KEYS = ("version", "model_path", "served_model_name", "dtype", "tp_size", "attention_backend",
                    "speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
                    "speculative_eagle_topk", "speculative_num_draft_tokens", "mem_fraction_static",
                    "max_total_tokens", "cuda_graph_max_bs", "disable_cuda_graph", "disable_radix_cache",
                    "sampling_backend", "kv_cache_dtype", "page_size", "max_running_requests",
                    "max_total_num_tokens", "enable_metrics", "sleep_on_idle")


def state_path(port: int, state_dir: Path = STATE_DIR) -> Path:
    return Path(state_dir) / f"server-{port}.json"


def last_log_lines(log: Path, n: int = 3) -> str:
    """The last ``n`` non-blank lines of a log, joined on one line (``|``)."""
    try:
        text = Path(log).read_bytes()[-20000:].decode(errors="replace")
    except OSError:
        return "no log"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return one_line(" | ".join(lines[-n:]))[:600] or "empty log"


def summarize_info(info: dict) -> dict:
    """The server_info fields a baseline records (flags, version, and the speculative state)."""
    out = {k: info.get(k) for k in SERVER_INFO_KEYS if k in info}
    states = info.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        out["internal_state"] = {k: v for k, v in states[0].items() if isinstance(v, (int, float, str, bool))}
    return out


def process_identity(pid: int) -> dict | None:
    """What identifies a running process beyond its pid, from ``/proc``: its start time (clock ticks after
    boot, field 22 of ``stat``), its process group and its command line; None when it does not run here."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": comm may hold spaces and parentheses
        if fields[0] in ("Z", "X"):
            return None
        return {"start_ticks": int(fields[19]), "pgid": int(fields[2]),
                "cmdline": [os.fsdecode(a) for a in raw.split(b"\0")[:-1]]}
    except (OSError, IndexError, ValueError):
        return None


def _ours(doc: dict) -> tuple[bool, str]:
    """Whether the process a state file names is still the server our launch started (pid, start time and
    command line all match, and it leads its process group); else what differs."""
    now = process_identity(doc["pid"])
    if now is None:
        return False, f"pid {doc['pid']} is not running"
    if now["start_ticks"] != doc.get("start_ticks"):
        return False, f"pid {doc['pid']} started at another time (a different process)"
    if now["cmdline"] != doc.get("cmdline"):
        return False, f"pid {doc['pid']} runs {one_line(' '.join(now['cmdline']))[:80]!r}"
    if now["pgid"] != doc["pid"]:
        return False, f"pid {doc['pid']} does not lead its process group"
    return True, ""


def _read_state(state: Path) -> dict:
    doc = read_json(state, what="server state")
    if not isinstance(doc, dict) or isinstance(doc.get("pid"), bool) or not isinstance(doc.get("pid"), int):
        raise BadInput("server state file is not ours", where=str(state), expected="a pid written by invoke "
                       "sglang.launch", found=type(doc).__name__ if not isinstance(doc, dict) else repr(doc.get("pid")),
                       fix="nothing was signalled or removed")
    return doc


def check_port(host: str, port: int) -> None:
    """Refuse (one line naming the port) a port this host cannot listen on: another service holds it."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except (OSError, UnicodeError) as exc:
        raise BadInput("server host cannot be resolved", where=f"--host {host}", found=str(exc)[:80]) from None
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free, as for SGLang
        try:
            s.bind((host, port))
        except OSError as exc:
            held = exc.errno == errno.EADDRINUSE
            raise BadInput("port already in use by another service" if held else "cannot listen on that port",
                           where=f"--port {port}", expected=f"a free port on {host}",
                           found=f"{host}:{port} " + ("taken" if held else (exc.strerror or str(exc))),
                           fix="stop what holds it, or choose another --port") from None


def check_drafter(target: str, drafter: str | None) -> Path:
    """The target's folder, after refusing a drafter SGLang cannot serve (a P-EAGLE one) or whose shape does not
    fit the target (before any launch): hidden size, vocabulary and aux layers against the target's config.json
    (``eaglekb.formats.inspect``), then the engine's own check (``eaglekb.measure.setup.check_drafter_fits``)."""
    if drafter:
        path = sources.resolve(target, prepare_missing=False)
        errors = [f for f in inspect_checkpoint(drafter, target=path)["findings"] if f["severity"] == "error"]
        for f in errors:
            if f["code"] == "parallel-drafter":
                raise Incompatible("drafter is not one SGLang can serve", where=f"--drafter {drafter}",
                                   expected="an EAGLE-3 drafter", found=f["message"])
        bad = [f for f in errors if f["code"].startswith("target-")]
        if bad:
            raise Incompatible("drafter does not fit the target", where=f"--drafter {drafter}",
                               expected=f"a drafter built for {target}", found=bad[0]["message"]
                               + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""),
                               fix=f"invoke inspect {drafter} --target {target} lists every mismatch")
    return check_drafter_fits(target, drafter)


def launch(cfg: LaunchConfig, *, site: str | Path | None = None, log: Path | None = None,
           state_dir: Path = STATE_DIR, python: str = sys.executable, env: dict | None = None) -> dict:
    """Start the server in its own session; the state (pid, start time, command line, log) written before it
    returns. Refused first: a server of ours still running on the port, a port another service holds."""
    state = state_path(cfg.port, state_dir)
    if state.is_file():
        old = read_json(state, what="server state")
        if isinstance(old, dict) and isinstance(old.get("pid"), int) and _ours(old)[0]:
            raise BadInput("a server we started is already running on that port", where=f"--port {cfg.port}",
                           found=f"pid {old['pid']}", fix=f"invoke sglang.stop --port {cfg.port}, or another --port")
    check_port(cfg.host, cfg.port)
    if site is not None and not Path(site).is_dir():
        raise MissingFile("serving stack folder not found", where=f"--site {site}",
                          fix="install it first: invoke sglang.install PIECES --target DIR")
    client = SGLangClient(f"http://{cfg.host}:{cfg.port}", timeout=5)
    cmd = launch_command(cfg, python=python)
    log = Path(log) if log is not None else Path(state_dir) / f"server-{cfg.port}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    child_env = dict(os.environ if env is None else env)
    if site is not None:
        child_env["PYTHONPATH"] = str(Path(site).resolve())  # the stack only: not our tasks' packages
    child_env.update(cfg.env)
    started = time.time()
    with open(log, "wb") as fh:  # one log per launch: this run's output only, under a header naming it
        fh.write(f"# launched {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(started))}: {command_line(cmd)}\n"
                 .encode())
        fh.flush()
        try:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=child_env, start_new_session=True)
        except OSError as exc:
            raise BadInput("server interpreter cannot run", where=f"--python {python}",
                           expected="a Python interpreter", found=exc.strerror or type(exc).__name__) from None
    # the start time is set at fork; the command line is the argv we exec'd (/proc may show it empty a moment)
    ident = process_identity(proc.pid) or {}
    doc = {"pid": proc.pid, "port": cfg.port, "url": client.url, "command": command_line(cmd), "log": str(log),
           "env": dict(cfg.env), "start_ticks": ident.get("start_ticks"), "cmdline": [str(a) for a in cmd],
           "site": str(site) if site is not None else None, "started_at": started}
    atomic_write_json(state, doc)
    doc["_proc"], doc["_state"] = proc, state
    return doc


def _forget(doc: dict) -> None:
    """A launch that failed: its state file goes (a server that is not running leaves no state to stop)."""
    state = doc.get("_state")
    if state is not None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            if read_json(state, what="server state").get("pid") == doc["pid"]:
                Path(state).unlink()


def wait_ready(doc: dict, *, timeout_s: float = 600.0, progress: bool = True, interval_s: float = 2.0) -> dict:
    """Poll ``/health`` until 200; server_info then. A server that exits or times out: one line, stopped."""
    client = SGLangClient(doc["url"], timeout=30)
    t0, last = time.perf_counter(), 0.0
    proc = doc.get("_proc")
    while True:
        code = proc.poll() if proc is not None else (None if process_alive(doc["pid"]) else -1)
        if code is not None:
            _forget(doc)
            raise Unavailable(f"SGLang server exited during start-up (exit {code})", where=doc["log"],
                              found=f"last log lines: {last_log_lines(Path(doc['log']))}")
        if client.ready():
            break
        waited = time.perf_counter() - t0
        if waited > timeout_s:
            stop_launched(doc)
            _forget(doc)
            raise Unavailable("SGLang server not healthy in time (stopped)", where=doc["log"],
                              expected=f"/health 200 within {timeout_s:.0f} s",
                              found=f"last log lines: {last_log_lines(Path(doc['log']))}",
                              fix="raise --timeout-s or read the log")
        if progress and waited - last >= 10:
            last = waited
            print(f"still starting: SGLang on :{doc['port']}, {waited:.0f} s (log {doc['log']})", file=sys.stderr,
                  flush=True)
        time.sleep(interval_s)
    info = client.server_info()
    doc = {k: v for k, v in doc.items() if not k.startswith("_")}
    doc.update(ready_s=round(time.time() - doc["started_at"], 1), server_info=summarize_info(info))
    return doc


def free_fraction() -> float | None:
    """The free share of the first visible GPU's memory (0-1) as this process sees it; None without one.
    SGLang 0.5.17 sizes a server from the memory free when it starts (its KV pool is what is free after its
    weights, less ``(1 - mem_fraction_static)`` of the memory that was free before them), so servers sharing a
    GPU are launched one after another, each with a fraction of what is free then."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        free, total = torch.cuda.mem_get_info()
        return free / total if total else None
    except Exception:  # no usable GPU here: the caller keeps its fixed share
        return None


def fraction_for_share(share: float, free: float | None, *, where: str = "--gpu-share") -> float:
    """The --mem-fraction-static that gives a server ``share`` of the whole GPU when ``free`` of it is free now
    (``free_fraction``); the share itself without a reading. One line when what is free cannot hold it."""
    if not free:
        return round(share, 3)
    if share / free > 0.95:
        raise Unavailable("the GPU has too little free memory for that share", where=f"{where} {share:g}",
                          expected=f"a share of at most {0.95 * free:.2f} (the GPU is {free:.0%} free now)",
                          found=f"{share:g}", fix="stop a server on this GPU or ask for a smaller share")
    return round(share / free, 3)


def stop_pid(pid: int, *, grace_s: float = 30.0) -> bool:
    """SIGTERM the process group ``pid`` leads, SIGKILL after ``grace_s``; False if it was not running."""
    if not process_alive(pid):
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.perf_counter() + grace_s
    while process_alive(pid) and time.perf_counter() < deadline:
        time.sleep(0.5)
    if process_alive(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        time.sleep(1.0)
    return True


def stop_launched(doc: dict) -> None:
    """Stop a server this process launched (``launch``) and reap it: no zombie, no warning at exit."""
    stop_pid(doc["pid"])
    proc = doc.get("_proc")
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            proc.wait(timeout=5)


def stop(port: int, *, state_dir: Path = STATE_DIR) -> dict:
    """Stop the server our launch recorded for ``port``; its state file removed. Signals only the process
    whose pid, start time and command line all match the state file (one line and nothing touched else)."""
    state = state_path(port, state_dir)
    if not state.is_file():
        raise MissingFile("no server started by invoke sglang.launch on that port", where=f"--port {port}",
                          expected=str(state))
    doc = _read_state(state)
    if not process_alive(doc["pid"]):
        state.unlink()
        return {"port": port, "pid": doc["pid"], "was_running": False, "log": doc.get("log")}
    ours, why = _ours(doc)
    if not ours:
        raise BadInput("process is not the server our launch started", where=str(state),
                       expected=f"pid {doc['pid']} with the start time and command line launch recorded", found=why,
                       fix=f"nothing was signalled; if that server is gone, remove {state}")
    was_running = stop_pid(doc["pid"])
    state.unlink()
    return {"port": port, "pid": doc["pid"], "was_running": was_running, "log": doc.get("log")}
