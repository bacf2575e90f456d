"""The embedded EAGLE-3 speculative decoding engine (PyTorch, CPU or CUDA).

Owns: static KV caches (``kv``), a target forward of its own over a loaded
transformers model's weights (``model``), the drafter's inference forward and
tree drafting (``draft``), greedy and sampled verification (``verify``), the
prefill -> draft -> verify -> accept loop (``generate``), timers (``timing``)
and switchable CUDA-graph capture (``cuda_graphs``).

Knows nothing about baselines, prompts sets or the task runner: ``eaglekb.measure.probe``
and ``eaglekb.measure.bench`` drive it.
"""

from eaglekb.engine.generate import Engine, GenResult, SpecConfig  # noqa: F401
