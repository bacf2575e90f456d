"""First look at the GPU machine: the converted target loads, generates, and our adapter runs on CUDA.

    python3 scripts/gpu_check.py /tmp/eaglekb-cache/models/smollm2-135m

Prints one JSON document (versions, GPU, load time, HF generate tok/s with CUDA-synchronised timing).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import transformers  # noqa: E402


def main(model_dir: str) -> None:
    from eaglekb.measure import provenance
    from eaglekb.models.target import Target

    out = {"host": provenance.host_state(), "versions": provenance.package_versions()}
    t0 = time.perf_counter()
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    torch.cuda.synchronize()
    out["load_s"] = time.perf_counter() - t0
    msgs = [[{"role": "user", "content": q}] for q in ("What is the capital of France?", "Tell me about the Moon.")]
    times = []
    for rep in range(4):
        for m in msgs:
            ids = tok.apply_chat_template(m, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"].cuda()
            torch.cuda.synchronize()
            t = time.perf_counter()
            gen = model.generate(ids, max_new_tokens=128, do_sample=False, min_new_tokens=128)
            torch.cuda.synchronize()
            if rep:  # first round is warm-up
                times.append((gen.shape[1] - ids.shape[1]) / (time.perf_counter() - t))
    out["hf_generate_tok_s_median"] = statistics.median(times)
    out["hf_generate_tok_s_range"] = [min(times), max(times)]
    out["sample"] = tok.decode(gen[0, ids.shape[1]:ids.shape[1] + 30])
    target = Target.load(model_dir, dtype="bfloat16", device="cuda") if hasattr(Target, "load") else None
    if target is not None:
        res = target.forward(ids)
        out["aux_hidden_shape"] = list(getattr(res, "aux_hidden", getattr(res, "aux_hidden_states", torch.empty(0))).shape)
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main(sys.argv[1])
