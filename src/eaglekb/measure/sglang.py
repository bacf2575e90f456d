"""SGLang as a bench backend: the launch command and a client for a running server.

Owns: ``launch_command`` (``python -m sglang.launch_server`` with the EAGLE-3 flags:
``--speculative-algorithm EAGLE3``, ``--speculative-draft-model-path``,
``--speculative-num-steps``, ``--speculative-eagle-topk``,
``--speculative-num-draft-tokens``, tensor parallelism and the rest), and
``SGLangClient``, which posts to a server's native ``/generate`` endpoint, reads
``meta_info`` (``completion_tokens``, ``spec_verify_ct``, ``spec_accept_length``) and
computes the accept length as ``completion_tokens / spec_verify_ct`` (bonus
included, SGLang's definition), plus a small benchmark whose result has the same
shape as ``eaglekb.measure.bench`` (median tok/s, range over repeats).

Not run here: no SGLang build on our machines. The command builder and the
response parsing are tested; the client's HTTP path is tested against a local stub
server. urllib only (no new dependency). Knows nothing about the task runner.
"""

from __future__ import annotations

import json
import shlex
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from eaglekb.io.errors import BadInput, SchemaError, Unavailable


@dataclass
class LaunchConfig:
    """Server settings (SGLang flag names without the leading dashes)."""

    model_path: str
    draft_model_path: str | None = None
    steps: int = 3
    topk: int = 1
    draft_tokens: int | None = None  # None: steps + 1 for a chain
    tp: int = 1
    host: str = "127.0.0.1"
    port: int = 30000
    dtype: str | None = None
    mem_fraction_static: float | None = None
    cuda_graph_max_bs: int | None = None
    disable_cuda_graph: bool = False
    trust_remote_code: bool = False
    attention_backend: str | None = None
    extra: list[str] = field(default_factory=list)


def launch_command(cfg: LaunchConfig, python: str = "python") -> list[str]:
    """argv for ``python -m sglang.launch_server`` (with EAGLE-3 when a drafter is given)."""
    for name in ("steps", "topk", "tp", "port"):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise BadInput(f"{name} must be a whole number >= 1", where=f"LaunchConfig.{name}", found=repr(v))
    cmd = [python, "-m", "sglang.launch_server", "--model-path", cfg.model_path, "--tp", str(cfg.tp),
           "--host", cfg.host, "--port", str(cfg.port)]
    if cfg.draft_model_path:
        n = cfg.draft_tokens if cfg.draft_tokens is not None else (cfg.steps + 1 if cfg.topk == 1 else None)
        if n is None:
            raise BadInput("a tree needs a draft-token budget", where="--draft-tokens",
                           expected="an integer (SGLang --speculative-num-draft-tokens)", found="none")
        if cfg.topk == 1 and n != cfg.steps + 1:
            raise BadInput("with topk 1 the draft tokens are steps + 1", where="--draft-tokens",
                           expected=str(cfg.steps + 1), found=str(n))
        cmd += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", cfg.draft_model_path,
                "--speculative-num-steps", str(cfg.steps), "--speculative-eagle-topk", str(cfg.topk),
                "--speculative-num-draft-tokens", str(n)]
    if cfg.dtype:
        cmd += ["--dtype", cfg.dtype]
    if cfg.mem_fraction_static is not None:
        cmd += ["--mem-fraction-static", str(cfg.mem_fraction_static)]
    if cfg.cuda_graph_max_bs is not None:
        cmd += ["--cuda-graph-max-bs", str(cfg.cuda_graph_max_bs)]
    if cfg.disable_cuda_graph:
        cmd.append("--disable-cuda-graph")
    if cfg.trust_remote_code:
        cmd.append("--trust-remote-code")
    if cfg.attention_backend:
        cmd += ["--attention-backend", cfg.attention_backend]
    return cmd + list(cfg.extra)


def command_line(cmd: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in cmd)


@dataclass
class Completion:
    """One /generate response, reduced to what a bench needs."""

    text: str
    completion_tokens: int
    verify_ct: int | None
    accept_len: float | None  # completion_tokens / spec_verify_ct (bonus included)
    reported_accept_len: float | None  # meta_info.spec_accept_length as the server reported it
    latency_s: float = 0.0


def parse_generate(doc: Any, where: str = "/generate response") -> Completion:
    """Read text and ``meta_info`` from a native /generate response (one-line errors)."""
    if isinstance(doc, list):
        if len(doc) != 1:
            raise SchemaError("expected one completion", where=where, expected="a single object", found=f"{len(doc)} items")
        doc = doc[0]
    if not isinstance(doc, dict) or not isinstance(doc.get("meta_info"), dict):
        raise SchemaError("response has no meta_info", where=where, expected='{"text": ..., "meta_info": {...}}',
                          found=type(doc).__name__ if not isinstance(doc, dict) else ", ".join(sorted(doc)) or "{}")
    meta = doc["meta_info"]
    tokens = meta.get("completion_tokens")
    if not isinstance(tokens, int) or tokens < 0:
        raise SchemaError("missing completion_tokens", where=f"{where}:meta_info.completion_tokens",
                          expected="an integer >= 0", found=repr(tokens))
    verify = meta.get("spec_verify_ct")
    if verify is not None and (not isinstance(verify, int) or verify < 0):
        raise SchemaError("bad spec_verify_ct", where=f"{where}:meta_info.spec_verify_ct",
                          expected="an integer >= 0", found=repr(verify))
    reported = meta.get("spec_accept_length")
    return Completion(text=str(doc.get("text", "")), completion_tokens=tokens, verify_ct=verify,
                      accept_len=tokens / verify if verify else None,
                      reported_accept_len=float(reported) if isinstance(reported, (int, float)) else None)


class SGLangClient:
    """A running SGLang server (native API)."""

    def __init__(self, url: str = "http://127.0.0.1:30000", *, timeout: float = 600.0):
        if not url.startswith(("http://", "https://")):
            raise BadInput("server URL must start with http:// or https://", where="--url", found=repr(url))
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _request(self, path: str, body: dict | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method="POST" if data else "GET",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise Unavailable("SGLang server refused the request", where=self.url + path,
                              expected="HTTP 200", found=f"HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise Unavailable("SGLang server unreachable", where=self.url, found=str(reason).splitlines()[0][:160],
                              fix="start it (see `launch_command`) or pass the right --url") from None
        try:
            return json.loads(raw)
        except ValueError:
            raise SchemaError("server answered with non-JSON", where=self.url + path,
                              expected="a JSON document", found=raw[:80].decode(errors="replace")) from None

    def server_info(self) -> dict:
        return self._request("/get_server_info")

    def generate(self, prompt: str | list[int], max_new_tokens: int, *, temperature: float = 0.0,
                 ignore_eos: bool = True) -> Completion:
        body: dict[str, Any] = {"sampling_params": {"max_new_tokens": max_new_tokens, "temperature": temperature,
                                                    "ignore_eos": ignore_eos}}
        body["input_ids" if isinstance(prompt, list) else "text"] = prompt
        t0 = time.perf_counter()
        out = parse_generate(self._request("/generate", body), where=self.url + "/generate")
        out.latency_s = time.perf_counter() - t0
        return out

    def bench(self, prompts: list, max_new_tokens: int, *, repeats: int = 3, warmup: int = 1) -> dict:
        """Sequential single-stream requests: median tok/s and accept length, range over repeats."""
        from eaglekb.engine.timing import stats

        for _ in range(warmup):
            self.generate(prompts[0], min(max_new_tokens, 16))
        tps, acc = [], []
        for _ in range(repeats):
            tokens, secs, verify = 0, 0.0, 0
            for p in prompts:
                c = self.generate(p, max_new_tokens)
                tokens += c.completion_tokens
                secs += c.latency_s
                verify += c.verify_ct or 0
            tps.append(tokens / secs if secs else 0.0)
            if verify:
                acc.append(tokens / verify)
        out = {"median_tok_s": stats(tps)["median"], "spread": {"median_tok_s": stats(tps)["range"]}}
        if acc:
            out["accept_len"] = stats(acc)["median"]
            out["spread"]["accept_len"] = stats(acc)["range"]
        return out
