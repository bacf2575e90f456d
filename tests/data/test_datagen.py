"""The datagen run: regeneration, features, shards, resume, the SGLang client path (CPU, tiny models)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import torch

from eaglekb.data import datagen, generation
from eaglekb.data.chat import chat_prefix_ids
from eaglekb.data.features import OnlineFeatures
from eaglekb.formats import shards
from eaglekb.io.errors import Incompatible, IntegrityError, SchemaError, Unavailable
from eaglekb.models.server import SGLangClient, parse_chat
from helpers.datagen import make_target, prompts, small_cfg

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return make_target(tmp_path_factory.mktemp("target") / "tiny")


@pytest.fixture(scope="module")
def target(target_dir):
    return generation.load_target(target_dir, dtype="float32")


def test_generate_store_and_read(target, tmp_path):
    out = tmp_path / "data"
    man = datagen.run(target, prompts(6), out, small_cfg(), progress=False)
    assert man["totals"]["sequences"] == 6 and len(man["shards"]) == 2
    ds = shards.open_dataset(out, verify="sha256")
    assert len(ds) == 6 and ds.capture_points == target.capture_points
    seq = ds.get(0)
    n = len(seq["input_ids"])
    assert seq["aux_hidden"].shape == (n, 3 * 32) and seq["final_hidden"].shape == (n, 32)
    # the loss mask covers exactly the response: after the assistant header
    prefix = chat_prefix_ids(target.tokenizer, prompts(1).prompts[0].messages)
    assert seq["loss_mask"][: len(prefix)].sum() == 0 and seq["loss_mask"][len(prefix):].all()
    # greedy self-distillation: the stored argmax of position p is the token at p+1 in the response
    ids, am = seq["input_ids"].long(), seq["target_argmax"].long()
    resp = torch.arange(len(prefix) - 1, n - 1)
    assert torch.equal(am[resp], ids[resp + 1])
    # stored features equal a fresh target pass
    res = target.forward(ids[None])
    assert torch.allclose(res.aux_hidden[0], seq["aux_hidden"], atol=1e-5)
    assert (out / shards.HEAD_FILE).is_file()
    rep = datagen.storage_report(man)
    assert rep["hidden_state_bytes_per_token_bytes"] == 4 * 32 * 4 and rep["bytes_per_token_bytes"] > 4 * 32 * 4


def test_resume_skips_written_shards_and_refuses_other_config(target, tmp_path):
    out = tmp_path / "data"
    datagen.run(target, prompts(8), out, small_cfg(), progress=False, stop_after_shards=1)
    first = (out / "shard-00000.safetensors").stat().st_mtime_ns
    man = datagen.run(target, prompts(8), out, small_cfg(), progress=False)
    assert man["last_run"]["shards_skipped_count"] == 1 and man["last_run"]["shards_written_count"] == 1
    assert (out / "shard-00000.safetensors").stat().st_mtime_ns == first
    full = datagen.run(target, prompts(8), tmp_path / "ref", small_cfg(), progress=False)
    a, b = shards.open_dataset(out), shards.open_dataset(tmp_path / "ref")
    assert all(torch.equal(a.get(i)["input_ids"], b.get(i)["input_ids"]) for i in range(8))
    assert full["totals"]["tokens"] == man["totals"]["tokens"]
    before = (out / shards.MANIFEST).read_text()
    with pytest.raises(Incompatible, match="another config"):
        datagen.run(target, prompts(8), out, small_cfg(max_new_tokens=5), progress=False)
    assert (out / shards.MANIFEST).read_text() == before


def test_sampled_mode_is_seeded_and_online_mode_stores_ids_only(target, tmp_path):
    a = datagen.run(target, prompts(3), tmp_path / "a", small_cfg(mode="sampled", seed=3), progress=False)
    b = datagen.run(target, prompts(3), tmp_path / "b", small_cfg(mode="sampled", seed=3), progress=False)
    assert a["totals"]["tokens"] == b["totals"]["tokens"]
    on = datagen.run(target, prompts(3), tmp_path / "on", small_cfg(features="online"), progress=False)
    seq = shards.open_dataset(tmp_path / "on").get(0)
    assert set(seq) == {"input_ids", "loss_mask"} and on["totals"]["hidden_bytes_per_token"] == 0
    feats = OnlineFeatures(target)(seq["input_ids"].long()[None], torch.ones(1, len(seq["input_ids"])))
    assert feats["aux_hidden"].shape[-1] == 96


def test_corrupt_or_truncated_shard_is_one_line(target, tmp_path):
    out = tmp_path / "data"
    datagen.run(target, prompts(4), out, small_cfg(), progress=False)
    shard = out / "shard-00000.safetensors"
    raw = bytearray(shard.read_bytes())
    raw[:8] = b"\xff" * 8
    shard.write_bytes(bytes(raw))
    with pytest.raises(IntegrityError, match="unreadable safetensors file") as err:
        shards.open_dataset(out)
    assert "\n" not in str(err.value)
    shard.write_bytes(bytes(raw[:100]))
    with pytest.raises(IntegrityError, match="size differs"):
        shards.open_dataset(out)


# ----------------------------------------------------------------------------- SGLang client path


class _Fake(BaseHTTPRequestHandler):
    requests: list = []
    fail_after: int | None = None

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        cls = type(self)
        if cls.fail_after is not None and len(cls.requests) >= cls.fail_after:
            self.send_response(503)
            self.end_headers()
            self.wfile.write(b"overloaded")
            return
        cls.requests.append((self.path, body))
        text = "echo " + body["messages"][-1]["content"][:10]
        doc = {"id": "x", "object": "chat.completion",
               "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}
        data = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    _Fake.requests = []
    _Fake.fail_after = None
    httpd = HTTPServer(("127.0.0.1", 0), _Fake)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", _Fake
    httpd.shutdown()
    httpd.server_close()


def test_request_building_and_parsing():
    client = SGLangClient("http://127.0.0.1:1/", model="kimi")
    msgs = [{"role": "user", "content": "hi"}]
    opts = generation.chat_options(datagen.DatagenConfig(max_new_tokens=7), "t:0")
    greedy = client.chat_request(msgs, **opts)
    assert greedy == {"model": "kimi", "messages": msgs, "max_tokens": 7, "temperature": 0.0}
    cfg = datagen.DatagenConfig(mode="sampled", temperature=0.6, top_p=0.9, seed=5)
    sampled = client.chat_request(msgs, **generation.chat_options(cfg, "t:0"))
    assert sampled["temperature"] == 0.6 and sampled["top_p"] == 0.9 and sampled["seed"] > 5
    assert sampled["seed"] == generation.chat_options(cfg, "t:0")["seed"] != generation.chat_options(cfg, "t:1")["seed"]
    doc = {"choices": [{"message": {"content": "ok"}, "finish_reason": "length"}]}
    assert parse_chat(doc) == ("ok", "length")
    with pytest.raises(SchemaError, match="not a chat-completions response"):
        parse_chat({"error": "bad"})


def test_server_regeneration_resumes_and_featurises(server, target, tmp_path):
    url, fake = server
    client = SGLangClient(url)
    cfg = small_cfg()
    progress = tmp_path / "responses.jsonl"
    fake.fail_after = 2
    with pytest.raises(Unavailable, match="HTTP 503"):
        generation.regenerate_via_server(prompts(4).prompts, client, cfg, progress, progress=False)
    assert len(generation.read_progress(progress)) == 2
    with open(progress, "a") as fh:  # an interrupted write leaves a torn line
        fh.write('{"id": "t:9", "resp')
    fake.fail_after = None
    done = generation.regenerate_via_server(prompts(4).prompts, client, cfg, progress, progress=False)
    assert len(done) == 4 and len(fake.requests) == 4  # the first two were not asked again
    assert fake.requests[0][0] == "/v1/chat/completions" and fake.requests[0][1]["temperature"] == 0.0
    man = datagen.run(target, prompts(4), tmp_path / "data", cfg, progress=False, responses=done)
    seq = shards.open_dataset(tmp_path / "data").get(0)
    text = "".join(target.tokenizer.convert_ids_to_tokens(seq["input_ids"][seq["loss_mask"].bool()].tolist()))
    assert text.startswith("echo tell me") and man["identity"]["config"]["source"] == "sglang"


def test_unreachable_server_is_one_line(tmp_path):
    client = SGLangClient("http://127.0.0.1:9", timeout=2)
    with pytest.raises(Unavailable, match="server unreachable"):
        generation.regenerate_via_server(prompts(1).prompts, client, small_cfg(), tmp_path / "r.jsonl", progress=False)
