"""A target behind a server: the one HTTP client of a running SGLang server.

Owns ``SGLangClient``: JSON requests with a timeout (urllib only, no new dependency),
one-line errors (``Unavailable`` for an unreachable server or an HTTP error,
``SchemaError`` for a body that is not the expected JSON), and the parsing of the two
endpoints the project uses:

* ``/v1/chat/completions`` (OpenAI-compatible; ``chat``): the assistant text and the
  finish reason. Datagen regenerates responses of targets too large for one GPU this way.
* ``/generate`` (SGLang native; ``generate``): the text, the output token ids and ``meta_info``
  (``completion_tokens``, ``spec_verify_ct``, ``spec_accept_length``; with ``--enable-metrics``
  the server's own timestamps and decode rate), with the accept length as
  ``completion_tokens / spec_verify_ct`` (bonus included, SGLang's definition).
  The SGLang bench backend (``eaglekb.measure.sglang.bench``) times these.
* ``/health`` (``ready``: 200 once the server has warmed up, 503 while it starts),
  ``/get_server_info`` (``server_info``), ``/flush_cache`` and the torch profiler's
  ``/start_profile`` (``start_profile``).

A URL is checked where it enters (``check_url``): scheme, host, port, no spaces, control characters or
non-ASCII text, each refused in one line naming the option it came from.

Knows nothing about datasets, prompt sets, benchmarks, the launch command or the task runner.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Sequence

from eaglekb.io.errors import BadInput, SchemaError, Unavailable

DEFAULT_URL = "http://127.0.0.1:30000"
#: meta_info fields of a server started with ``--enable-metrics`` (SGLang 0.5.17): when the request
#: arrived, entered the forward pass, finished prefill, finished, and left; the decode rate it saw.
SERVER_TIMES = ("request_received_ts", "forward_entry_time", "prefill_finished_time", "request_finished_ts",
                "response_sent_to_client_ts", "decode_throughput")


@dataclass
class Completion:
    """One /generate response, reduced to what a bench needs."""

    text: str
    completion_tokens: int
    verify_ct: int | None
    accept_len: float | None  # completion_tokens / spec_verify_ct (bonus included)
    reported_accept_len: float | None  # meta_info.spec_accept_length as the server reported it
    latency_s: float = 0.0
    output_ids: list[int] | None = None  # the generated token ids, where the server returned them
    #: the server's own timing (``--enable-metrics``): timestamps in seconds and its decode rate
    server: dict[str, float] = field(default_factory=dict)
    sent_ts: float | None = None  # client wall clock (time.time()) when the request left / the answer arrived
    received_ts: float | None = None


def _shown(doc: Any) -> str:
    return doc[:120] if isinstance(doc, str) else json.dumps(doc)[:120]


def parse_chat(doc: Any, where: str = "response") -> tuple[str, str | None]:
    """(assistant text, finish_reason) of a chat-completions response; one line on a bad shape."""
    try:
        choice = doc["choices"][0]
        content = choice["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise SchemaError("not a chat-completions response", where=where,
                          expected='{"choices": [{"message": {"content": ...}}]}', found=_shown(doc)) from None
    if not isinstance(content, str):
        raise SchemaError("response content is not text", where=where, expected="a string",
                          found=type(content).__name__)
    return content, choice.get("finish_reason")


def parse_generate(doc: Any, where: str = "/generate response") -> Completion:
    """Read text and ``meta_info`` from a native /generate response (one-line errors)."""
    if isinstance(doc, list):
        if len(doc) != 1:
            raise SchemaError("expected one completion", where=where, expected="a single object",
                              found=f"{len(doc)} items")
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
    ids = doc.get("output_ids")
    if ids is not None and (not isinstance(ids, list) or not all(isinstance(t, int) for t in ids)):
        raise SchemaError("bad output_ids", where=f"{where}:output_ids", expected="a list of token ids",
                          found=_shown(ids))
    server = {k: float(meta[k]) for k in SERVER_TIMES if isinstance(meta.get(k), (int, float))}
    return Completion(text=str(doc.get("text") or ""), completion_tokens=tokens, verify_ct=verify,
                      accept_len=tokens / verify if verify else None,
                      reported_accept_len=float(reported) if isinstance(reported, (int, float)) else None,
                      output_ids=ids, server=server)


def check_url(url: Any, option: str = "--url") -> str:
    """``url`` without a trailing ``/`` after checking it is an http(s) URL with a host and a valid port, in
    printable ASCII (a space or control character would reach the HTTP request line); one line otherwise."""
    form = "a URL such as http://127.0.0.1:30000"
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise BadInput("server URL must start with http:// or https://", where=option, expected=form,
                       found=repr(url)[:120])
    bad = next((ch for ch in url if not 32 < ord(ch) < 127), None)
    if bad is not None:
        raise BadInput("server URL holds a space, control character or non-ASCII character", where=option,
                       expected=form, found=f"{bad!r} in {url!r}"[:160])
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise BadInput("server URL is malformed", where=option, expected=form,
                       found=f"{url!r}: {exc}"[:160]) from None
    if not parts.hostname or port == 0:
        raise BadInput("server URL has no host" if not parts.hostname else "server URL has port 0", where=option,
                       expected=form, found=repr(url)[:120])
    return url.rstrip("/")


class SGLangClient:
    """A running SGLang (or, for ``chat``, any OpenAI-compatible) server.

    ``model`` is the name sent in chat requests; ``option`` names the command-line
    option the URL came from, for the one-line errors.
    """

    def __init__(self, url: str = DEFAULT_URL, *, model: str = "default", timeout: float = 600.0,
                 option: str = "--url"):
        self.url = check_url(url, option)
        self.model = model
        self.timeout = timeout
        self.option = option

    def _raw(self, path: str, body: dict | None) -> bytes:
        """POST ``body`` (GET when None) as JSON to ``path``; the answer's bytes (one line on an error)."""
        url = self.url + path
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method="POST" if data else "GET",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return resp.read()
        except urllib.error.HTTPError as exc:
            text = exc.read()[:200].decode(errors="replace").replace("\n", " ").strip()
            raise Unavailable("SGLang server answered with an error", where=url, expected="HTTP 200",
                              found=f"HTTP {exc.code}" + (f": {text}" if text else "")) from None
        except http.client.InvalidURL as exc:  # what check_url missed: still the user's URL, one line
            raise BadInput("server URL rejected", where=self.option, found=f"{url!r}: {exc}"[:160]) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = (str(getattr(exc, "reason", exc)).splitlines() or [type(exc).__name__])[0][:160]
            fix = f"start it (python -m sglang.launch_server ...) or pass the right {self.option}"
            raise Unavailable("SGLang server unreachable", where=url, found=reason, fix=fix) from None

    def request(self, path: str, body: dict | None = None) -> Any:
        """POST ``body`` (GET when None) as JSON to ``path``; the parsed JSON answer."""
        raw = self._raw(path, body)
        try:
            return json.loads(raw)
        except ValueError:
            raise SchemaError("server answered with non-JSON", where=self.url + path, expected="a JSON document",
                              found=raw[:80].decode(errors="replace")) from None

    def server_info(self) -> dict:
        info = self.request("/get_server_info")
        if not isinstance(info, dict):
            raise SchemaError("server_info is not an object", where=self.url + "/get_server_info",
                              expected="a JSON object", found=_shown(info))
        return info

    def ready(self) -> bool:
        """True once ``/health`` answers 200 (the server warmed up); False while it starts or is unreachable."""
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=min(self.timeout, 5.0)) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def post(self, path: str, body: dict | None = None) -> str:
        """POST to an endpoint that answers plain text (``/flush_cache``, ``/start_profile``); its text."""
        return self._raw(path, body or {})[:500].decode(errors="replace")

    def start_profile(self, output_dir: str, num_steps: int, *, activities=("CPU", "GPU")) -> str:
        """Start SGLang's torch profiler for ``num_steps`` forward steps, traces written to ``output_dir``."""
        return self.post("/start_profile", {"output_dir": output_dir, "num_steps": int(num_steps),
                                            "activities": list(activities)})

    def chat_request(self, messages: Sequence[dict], *, max_tokens: int, temperature: float = 0.0,
                     top_p: float | None = None, seed: int | None = None) -> dict:
        """The body of a ``/v1/chat/completions`` request (``top_p`` and ``seed`` only when given)."""
        body: dict[str, Any] = {"model": self.model, "messages": list(messages), "max_tokens": int(max_tokens),
                                "temperature": temperature}
        if top_p is not None:
            body["top_p"] = top_p
        if seed is not None:
            body["seed"] = int(seed)
        return body

    def chat(self, messages: Sequence[dict], *, max_tokens: int, temperature: float = 0.0,
             top_p: float | None = None, seed: int | None = None) -> tuple[str, str | None]:
        """(assistant text, finish_reason) of one chat completion."""
        body = self.chat_request(messages, max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed)
        return parse_chat(self.request("/v1/chat/completions", body), where=self.url + "/v1/chat/completions")

    def generate(self, prompt: str | list[int], max_new_tokens: int, *, temperature: float = 0.0,
                 ignore_eos: bool = True) -> Completion:
        """One native ``/generate`` request (text or token ids), timed."""
        body: dict[str, Any] = {"sampling_params": {"max_new_tokens": max_new_tokens, "temperature": temperature,
                                                    "ignore_eos": ignore_eos}}
        body["input_ids" if isinstance(prompt, list) else "text"] = prompt
        sent, t0 = time.time(), time.perf_counter()
        out = parse_generate(self.request("/generate", body), where=self.url + "/generate")
        out.latency_s = time.perf_counter() - t0
        out.sent_ts, out.received_ts = sent, sent + out.latency_s  # wall clock, comparable with the server's
        return out
