"""A stand-in for an SGLang server: the endpoints our client uses, with SGLang 0.5.17's shapes.

``serve(...)`` runs one in a thread (tests of the bench); ``stub_package(folder)`` writes a package
``sglang/launch_server.py`` so that ``python -m sglang.launch_server --port N ...`` with that folder on
PYTHONPATH starts one as a process (tests of launch and stop). ``--stub-die`` makes it exit during
start-up with a last log line; ``--stub-delay S`` keeps /health at 503 for S seconds.
"""

from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable


def make_handler(info: dict, generate: Callable[[list[int], int], list[int]], ready_at: float = 0.0,
                 per_cycle: int = 2):
    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: bytes = b"", ctype: str = "application/json"):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):  # noqa: N802
            if self.path == "/health":
                self._send(200 if time.time() >= ready_at else 503)
            elif self.path == "/get_server_info":
                self._send(200, json.dumps(info).encode())
            else:
                self._send(404)

        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
            if self.path == "/start_profile":  # the scheduler writes a trace of the steps it profiled
                import gzip

                out = Path(body["output_dir"]) / f"{time.time()}-TP-0.trace.json.gz"
                out.write_bytes(gzip.compress(json.dumps(decode_trace(12)).encode()))
            if self.path != "/generate":
                self._send(200, b"ok", "text/plain")
                return
            received = time.time()
            n = body["sampling_params"]["max_new_tokens"]
            ids = body.get("input_ids") or [0]
            out = generate(ids, n)
            meta = {"completion_tokens": len(out), "prompt_tokens": len(ids), "request_received_ts": received,
                    "forward_entry_time": received + 1e-4, "prefill_finished_time": received + 2e-4}
            meta["request_finished_ts"] = time.time() + 3e-4
            meta["response_sent_to_client_ts"] = meta["request_finished_ts"] + 1e-4
            if info.get("speculative_algorithm"):
                meta["spec_verify_ct"] = max(1, math.ceil(len(out) / per_cycle))
                meta["spec_accept_length"] = len(out) / meta["spec_verify_ct"]
            self._send(200, json.dumps({"text": "x", "output_ids": out, "meta_info": meta}).encode())

        def log_message(self, *args):
            pass

    return Handler


def decode_trace(cycles: int) -> dict:
    """A decode trace shaped like PyTorch's: per cycle a draft graph (3 kernels), the verify graph (9), an eager op."""
    ev, t, corr = [], 0.0, 0
    for _ in range(cycles):
        for kind, n, dur in (("graph", 3, 10.0), ("graph", 9, 30.0), ("eager", 1, 5.0)):
            corr += 1
            name = "cudaGraphLaunch" if kind == "graph" else "cudaLaunchKernel"
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": name, "ts": t, "dur": 2, "args": {"correlation": corr}})
            for _k in range(n):
                ev.append({"ph": "X", "cat": "kernel", "name": "k", "ts": t + 3, "dur": dur / n,
                           "args": {"correlation": corr}})
                t += dur / n
            t += 10.0  # the GPU waits for the host between launches
    return {"traceEvents": ev}


def serve(info: dict, generate: Callable[[list[int], int], list[int]] | None = None, *, port: int = 0,
          per_cycle: int = 2) -> tuple[ThreadingHTTPServer, str]:
    """A stub in a daemon thread; (server, url). ``generate`` defaults to counting tokens 1..n."""
    gen = generate or (lambda ids, n: [(i % 50) + 1 for i in range(n)])
    server = ThreadingHTTPServer(("127.0.0.1", port), make_handler(info, gen, per_cycle=per_cycle))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}"


LAUNCH_SERVER = '''
import os, sys, time
from pathlib import Path
sys.path.insert(0, {helpers!r})
from sglang_stub import make_handler
from http.server import ThreadingHTTPServer
args = sys.argv[1:]
def flag(name, default=None):
    return args[args.index(name) + 1] if name in args else default
print("stub sglang: starting", flush=True)
if "--stub-die" in args:
    print("RuntimeError: CUDA out of memory (stub)", flush=True)
    sys.exit(3)
delay = float(flag("--stub-delay", "0.5"))
info = {{"version": "0.5.17-stub", "model_path": flag("--model-path"),
        "speculative_algorithm": flag("--speculative-algorithm"),
        "speculative_num_steps": int(flag("--speculative-num-steps", "0") or 0),
        "speculative_eagle_topk": int(flag("--speculative-eagle-topk", "0") or 0) or None,
        "speculative_num_draft_tokens": int(flag("--speculative-num-draft-tokens", "0") or 0) or None,
        "speculative_draft_model_path": flag("--speculative-draft-model-path"),
        "mem_fraction_static": float(flag("--mem-fraction-static", "0") or 0) or None,
        "stub_argv": args, "stub_env": {{k: v for k, v in os.environ.items() if k.startswith("STUB_")}}}}
srv = ThreadingHTTPServer(("127.0.0.1", int(flag("--port"))), make_handler(info, lambda ids, n: list(range(n)),
                          ready_at=time.time() + delay))
print("stub sglang: serving", flush=True)
srv.serve_forever()
'''


def stub_package(folder: Path) -> Path:
    """``folder/sglang/launch_server.py`` running the stub; ``folder`` goes on the server's PYTHONPATH."""
    pkg = Path(folder) / "sglang"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text(LAUNCH_SERVER.format(helpers=str(Path(__file__).parent)))
    return Path(folder)
