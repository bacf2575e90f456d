"""SGLang backend: the launch command, the one client (meta_info parsing, an unreachable server), a stub server."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from eaglekb.io.errors import BadInput, SchemaError, Unavailable
from eaglekb.measure.sglang.config import LaunchConfig, launch_command
from eaglekb.measure.sglang.bench import _sglang_method, method_metrics, passes
from eaglekb.models.server import SGLangClient, parse_generate


def test_launch_command_has_eagle3_flags():
    cmd = launch_command(LaunchConfig("/m/target", "/m/drafter", steps=3, topk=1, tp=8, port=31000))
    assert cmd[:3] == ["python", "-m", "sglang.launch_server"]
    flags = dict(zip(cmd[3::2], cmd[4::2]))
    assert flags["--speculative-algorithm"] == "EAGLE3"
    assert flags["--speculative-draft-model-path"] == "/m/drafter"
    assert flags["--speculative-num-steps"] == "3"
    assert flags["--speculative-eagle-topk"] == "1"
    assert flags["--speculative-num-draft-tokens"] == "4"
    assert flags["--tp"] == "8" and flags["--port"] == "31000"


def test_launch_command_tree_needs_budget_and_chain_checks_it():
    with pytest.raises(BadInput, match="budget"):
        launch_command(LaunchConfig("/m", "/d", steps=3, topk=4))
    assert "16" in launch_command(LaunchConfig("/m", "/d", steps=3, topk=4, draft_tokens=16))
    with pytest.raises(BadInput, match="steps \\+ 1"):
        launch_command(LaunchConfig("/m", "/d", steps=3, topk=1, draft_tokens=6))
    plain = launch_command(LaunchConfig("/m", disable_cuda_graph=True))
    assert "--speculative-algorithm" not in plain and "--disable-cuda-graph" in plain


def test_parse_generate_accept_length_from_meta_info():
    doc = {"text": "hi", "meta_info": {"completion_tokens": 128, "spec_verify_ct": 40, "spec_accept_length": 3.2}}
    c = parse_generate(doc)
    assert c.accept_len == pytest.approx(3.2) and c.reported_accept_len == pytest.approx(3.2)
    assert parse_generate([doc]).completion_tokens == 128
    assert parse_generate({"text": "", "meta_info": {"completion_tokens": 5}}).accept_len is None
    with pytest.raises(SchemaError, match="meta_info"):
        parse_generate({"text": "x"})
    with pytest.raises(SchemaError, match="completion_tokens"):
        parse_generate({"meta_info": {"completion_tokens": "many"}})


def test_unreachable_server_is_one_line():
    with pytest.raises(Unavailable) as err:
        SGLangClient("http://127.0.0.1:9", timeout=2).generate("hi", 4)
    assert "unreachable" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(BadInput):
        SGLangClient("localhost:30000")


class _Stub(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = body["sampling_params"]["max_new_tokens"]
        out = json.dumps({"text": "x" * n, "meta_info": {"completion_tokens": n, "spec_verify_ct": max(n // 2, 1)}})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(out.encode())

    def log_message(self, *args):
        pass


def test_client_bench_against_stub_server():
    server = HTTPServer(("127.0.0.1", 0), _Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = SGLangClient(f"http://127.0.0.1:{server.server_port}", timeout=5)
        runs = passes({"sglang": _sglang_method(client, 32)}, [[1, 2], [3]], 2, 1, progress=False)
        res, _ = method_metrics("sglang", runs["sglang"])
        assert res["accept_len"] == pytest.approx(2.0)
        assert res["median_tok_s"] > 0
    finally:
        server.shutdown()
