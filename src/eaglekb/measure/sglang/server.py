"""An SGLang server started and stopped by our tasks: launch, wait for health, server_info, stop by pid.

Owns ``launch`` (``python -m sglang.launch_server`` built by ``eaglekb.measure.sglang.config.launch_command``,
run in its own process session so that it outlives the task that started it, its output in a log
file, the serving stack's folder first on its ``PYTHONPATH`` only; a state file per port records the
pid, command, log and server_info), ``wait_ready`` (``/health`` polled with a timeout and a progress
line; a server that exits during start-up is refused with one line naming its last log lines), and
``stop`` (SIGTERM to the process group a state file names, SIGKILL after a grace period; nothing else
is signalled). Knows nothing about benchmarks or the task runner.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from eaglekb.io.errors import BadInput, MissingFile, Unavailable, one_line
from eaglekb.io.files import atomic_write_json, process_alive, read_json
from eaglekb.measure.sglang.config import LaunchConfig, command_line, launch_command
from eaglekb.models.server import SGLangClient

#: where launch keeps a state file and a log per port (``EAGLEKB_SGLANG_STATE`` overrides: on a lent machine whose
#: working tree is replaced between calls, keep it under /tmp)
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


def launch(cfg: LaunchConfig, *, site: str | Path | None = None, log: Path | None = None,
           state_dir: Path = STATE_DIR, python: str = sys.executable, env: dict | None = None) -> dict:
    """Start the server in its own session; the state (pid, command, log) written before it returns."""
    state = state_path(cfg.port, state_dir)
    if state.is_file():
        old = read_json(state, what="server state")
        if isinstance(old, dict) and isinstance(old.get("pid"), int) and process_alive(old["pid"]):
            raise BadInput("a server we started is already running on that port", where=f"--port {cfg.port}",
                           found=f"pid {old['pid']}", fix=f"invoke sglang.stop --port {cfg.port}, or another --port")
    client = SGLangClient(f"http://{cfg.host}:{cfg.port}", timeout=5)
    if client.ready():
        raise BadInput("something already answers on that port", where=f"--port {cfg.port}",
                       fix="stop it or choose another --port")
    if site is not None and not Path(site).is_dir():
        raise MissingFile("serving stack folder not found", where=f"--site {site}",
                          fix="install it first: invoke sglang.install PIECES --target DIR")
    cmd = launch_command(cfg, python=python)
    log = Path(log) if log is not None else Path(state_dir) / f"server-{cfg.port}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    child_env = dict(os.environ if env is None else env)
    if site is not None:
        child_env["PYTHONPATH"] = str(Path(site).resolve())  # the stack only: not our tasks' packages
    child_env.update(cfg.env)
    with open(log, "ab") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=child_env, start_new_session=True)
    doc = {"pid": proc.pid, "port": cfg.port, "url": client.url, "command": command_line(cmd), "log": str(log),
           "env": dict(cfg.env),
           "site": str(site) if site is not None else None, "started_at": time.time()}
    atomic_write_json(state, doc)
    doc["_proc"] = proc
    return doc


def wait_ready(doc: dict, *, timeout_s: float = 600.0, progress: bool = True, interval_s: float = 2.0) -> dict:
    """Poll ``/health`` until 200; server_info then. A server that exits or times out: one line, stopped."""
    client = SGLangClient(doc["url"], timeout=30)
    t0, last = time.perf_counter(), 0.0
    proc = doc.get("_proc")
    while True:
        code = proc.poll() if proc is not None else (None if process_alive(doc["pid"]) else -1)
        if code is not None:
            raise Unavailable(f"SGLang server exited during start-up (exit {code})", where=doc["log"],
                              found=f"last log lines: {last_log_lines(Path(doc['log']))}")
        if client.ready():
            break
        waited = time.perf_counter() - t0
        if waited > timeout_s:
            stop_pid(doc["pid"])
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
    doc = {k: v for k, v in doc.items() if k != "_proc"}
    doc.update(ready_s=round(time.time() - doc["started_at"], 1), server_info=summarize_info(info))
    return doc


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


def stop(port: int, *, state_dir: Path = STATE_DIR) -> dict:
    """Stop the server our launch recorded for ``port``; its state file removed."""
    state = state_path(port, state_dir)
    if not state.is_file():
        raise MissingFile("no server started by invoke sglang.launch on that port", where=f"--port {port}",
                          expected=str(state))
    doc = read_json(state, what="server state")
    if not isinstance(doc, dict) or not isinstance(doc.get("pid"), int):
        raise BadInput("server state file is not ours", where=str(state), expected="a pid")
    was_running = stop_pid(doc["pid"])
    state.unlink()
    return {"port": port, "pid": doc["pid"], "was_running": was_running, "log": doc.get("log")}
