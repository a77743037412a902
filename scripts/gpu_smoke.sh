#!/usr/bin/env bash
# GPU smoke test: one short training run per method (full fine-tuning and LoRA, bf16, vLLM colocate when
# `import vllm` works) and a short `exploration-trl eval`, then a pass/fail table. Exit status 1 if anything failed.
#
#   scripts/gpu_smoke.sh                       # all methods, full + LoRA, Qwen2.5-0.5B's architecture, no network
#   SMOKE_MODEL=Qwen/Qwen2.5-0.5B-Instruct scripts/gpu_smoke.sh      # the real model (Hub id or local dir)
#   SMOKE_METHODS="casp progrpo+casp" SMOKE_VARIANTS=lora scripts/gpu_smoke.sh
#
# Run it after upgrading TRL / vLLM / transformers / accelerate, on a new cluster or CUDA image, and before a long
# run with a new model. By default it needs no network: the model is Qwen2.5-0.5B's architecture at random weights,
# built from the config the package ships (`exploration_trl.random_model`, with a stand-in tokenizer), and the
# training and eval problems are the shipped GSM8K test problems. CI runs a tiny CPU form of it
# (tests/test_offline_device_checks.py: SMOKE_MODEL=random:toy SMOKE_ALLOW_CPU=1).
#
# Environment (all optional):
#   SMOKE_MODEL=random:qwen2.5-0.5b          random:NAME (a shipped architecture at random weights: qwen2.5-0.5b,
#                                            toy), or any causal LM id or local dir (LoRA targets q/k/v/o_proj)
#   SMOKE_METHODS="grpo progrpo dsgrpo casp kl_cov clip_cov"
#   SMOKE_VARIANTS="full lora"
#   SMOKE_VLLM=auto                          auto (colocate if `import vllm` works), 1 (require it) or 0 (off)
#   SMOKE_DATA=gsm8k                         gsm8k (the shipped GSM8K problems + math rewards), hub (the recipes'
#                                            Hub GSM8K) or countdown (built in)
#   SMOKE_MAX_STEPS=2  SMOKE_MAX_COMPLETION_LENGTH=128
#   SMOKE_EVAL=1                             0 skips the eval runs; adapter: only the first LoRA adapter's
#   SMOKE_OUT=<new temp dir>                 outputs and one log per run
#   SMOKE_LAUNCHER=accelerate                accelerate (configs/accelerate/single_gpu.yaml) or python
#   SMOKE_ALLOW_CPU=0                        1 runs on CPU without bf16/vLLM (only to check this script)
#   PYTHON=python
set -uo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
MODEL="${SMOKE_MODEL:-random:qwen2.5-0.5b}"
METHODS="${SMOKE_METHODS:-grpo progrpo dsgrpo casp kl_cov clip_cov}"
VARIANTS="${SMOKE_VARIANTS:-full lora}"
MAX_STEPS="${SMOKE_MAX_STEPS:-2}"
MAX_LEN="${SMOKE_MAX_COMPLETION_LENGTH:-128}"
DATA="${SMOKE_DATA:-gsm8k}"
LAUNCHER="${SMOKE_LAUNCHER:-accelerate}"
OUT="${SMOKE_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/exploration_trl_smoke.XXXXXX")}"
mkdir -p "$OUT"

# --- environment -------------------------------------------------------------------------------------
ON_CPU=0
if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  if [[ "${SMOKE_ALLOW_CPU:-0}" == "1" ]]; then
    ON_CPU=1
  else
    echo "error: no CUDA device visible to $PYTHON (set SMOKE_ALLOW_CPU=1 to check the script on CPU)" >&2
    exit 2
  fi
fi
case "${SMOKE_VLLM:-auto}" in
  auto) if [[ $ON_CPU == 0 ]] && "$PYTHON" -c "import vllm" >/dev/null 2>&1; then USE_VLLM=true; else USE_VLLM=false; fi ;;
  1) USE_VLLM=true
     "$PYTHON" -c "import vllm" >/dev/null 2>&1 || { echo "error: SMOKE_VLLM=1 but \`import vllm\` fails" >&2; exit 2; } ;;
  0) USE_VLLM=false ;;
  *) echo "error: SMOKE_VLLM must be auto, 1 or 0" >&2; exit 2 ;;
esac
"$PYTHON" - <<'PY' | tee "$OUT/versions.txt"
import importlib.metadata as md
import torch
parts = []
for name in ("torch", "transformers", "trl", "accelerate", "peft", "vllm", "deepspeed", "exploration_trl"):
    try:
        parts.append(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        parts.append(f"{name} -")
print("versions:", ", ".join(parts))
print("device:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")
PY
if [[ "$MODEL" == random:* ]]; then  # build the architecture at random weights, offline, once per output folder
  dtype=bfloat16; [[ $ON_CPU == 1 ]] && dtype=float32
  # The folder is the last line printed (a library may print a notice before it).
  built="$("$PYTHON" -m exploration_trl.random_model "${MODEL#random:}" "$OUT/model-${MODEL#random:}" --dtype "$dtype" \
           | tail -n 1)" || { echo "error: could not build $MODEL" >&2; exit 2; }
  echo "model: $MODEL at random weights, stand-in tokenizer -> $built"
  MODEL="$built"
fi
case "$DATA" in
  gsm8k|hub|countdown) ;;
  *) echo "error: SMOKE_DATA must be gsm8k, hub or countdown" >&2; exit 2 ;;
esac
echo "model: $MODEL   vLLM colocate: $USE_VLLM   data: $DATA   outputs: $OUT"

# --- runs --------------------------------------------------------------------------------------------
RESULTS=()   # "name|status|seconds|log"
record() { RESULTS+=("$1|$2|$3|$4"); printf '%-28s %-5s %5ss  %s\n' "$1" "$2" "$3" "$4"; }

train_cmd() {  # train_cmd METHOD VARIANT RUN_DIR
  local method="$1" variant="$2" dir="$3" base="${1%%+*}"
  local cmd=()
  if [[ "$LAUNCHER" == "accelerate" && $ON_CPU == 0 ]]; then
    cmd=(accelerate launch --config_file configs/accelerate/single_gpu.yaml -m exploration_trl.cli train)
  else
    cmd=("$PYTHON" -m exploration_trl.cli train)
  fi
  # The 0.5B recipe of the (first) method, shrunk to a few tiny steps. Two optimizer updates per rollout (the
  # recipes set 4 to 16, as their papers): small rollouts from 32 samples, and KL-Cov's penalty still acts.
  cmd+=(--config "configs/methods/${base}_qwen2.5-0.5b.yaml" --method "$method" --model_name_or_path "$MODEL"
        --output_dir "$dir" --max_steps "$MAX_STEPS" --per_device_train_batch_size 4 --num_generations 4
        --gradient_accumulation_steps 1 --steps_per_generation 2 --max_completion_length "$MAX_LEN" --max_train_samples 32
        --warmup_steps 0 --save_strategy no --logging_steps 1 --report_to none
        --use_vllm "$USE_VLLM" --vllm_mode colocate --vllm_gpu_memory_utilization 0.25
        --vllm_max_model_length $(( MAX_LEN + 512 )))
  if [[ "$DATA" == "countdown" ]]; then
    cmd+=(--dataset_name countdown --dataset_prompt_column prompt --reward_funcs countdown --reward_kwargs '{}'
          --reward_weights 1.0)
  elif [[ "$DATA" == "gsm8k" ]]; then  # the shipped problems: their prompt already asks for a boxed answer
    cmd+=(--dataset_name gsm8k --dataset_prompt_column prompt --dataset_prompt_template '')
  fi
  if [[ $ON_CPU == 1 ]]; then
    cmd+=(--bf16 false --use_cpu true --dtype float32)
  fi
  if [[ "$variant" == "lora" ]]; then
    cmd+=(--use_peft true --lora_r 8 --lora_alpha 16 --lora_target_modules q_proj k_proj v_proj o_proj)
  fi
  printf '%q ' "${cmd[@]}"
}

check_artifacts() {  # check_artifacts VARIANT RUN_DIR LOG -> message on failure
  local variant="$1" dir="$2" log="$3"
  if grep -Eq "'loss': '?nan" "$log"; then echo "NaN loss"; return 1; fi
  if [[ "$variant" == "lora" ]]; then
    [[ -f "$dir/adapter_config.json" ]] || { echo "no adapter_config.json"; return 1; }
    ls "$dir"/adapter_model.* >/dev/null 2>&1 || { echo "no adapter weights"; return 1; }
    ls "$dir"/model*.safetensors >/dev/null 2>&1 && { echo "LoRA run saved full weights"; return 1; }
  else
    ls "$dir"/model*.safetensors >/dev/null 2>&1 || { echo "no model weights"; return 1; }
  fi
  return 0
}

for method in $METHODS; do
  for variant in $VARIANTS; do
    name="${method}-${variant}"
    dir="$OUT/$name"
    log="$OUT/$name.log"
    cmd="$(train_cmd "$method" "$variant" "$dir")"
    echo "\$ $cmd" >"$log"
    start=$SECONDS
    rc=0
    bash -c "$cmd" >>"$log" 2>&1 </dev/null || rc=$?
    if (( rc != 0 )); then
      msg="exit status $rc"
    else
      msg=$(check_artifacts "$variant" "$dir" "$log") || true
    fi
    if [[ -z "$msg" ]]; then
      record "train $name" PASS $(( SECONDS - start )) "$log"
    else
      echo "smoke: $msg" >>"$log"
      record "train $name" FAIL $(( SECONDS - start )) "$log"
    fi
  done
done

if [[ "${SMOKE_EVAL:-1}" != "0" ]]; then
  eval_run() {  # eval_run NAME MODEL
    local name="$1" model="$2" dir="$OUT/$1" log="$OUT/$1.log"
    # The shipped GSM8K problems; 4 problems x 4 samples of at most MAX_LEN tokens keep it to seconds (a random
    # model never stops early, so every sample runs to the limit).
    local cmd=("$PYTHON" -m exploration_trl.cli eval --model "$model" --benchmark gsm8k --limit 4 --n 4
               --max-tokens "$MAX_LEN" --output-dir "$dir" --no-semantic --quiet)
    echo "\$ $(printf '%q ' "${cmd[@]}")" >"$log"
    local start=$SECONDS
    if "${cmd[@]}" >>"$log" 2>&1 && [[ -f "$dir/results.json" ]]; then
      record "$name" PASS $(( SECONDS - start )) "$log"
    else
      record "$name" FAIL $(( SECONDS - start )) "$log"
    fi
  }
  [[ "${SMOKE_EVAL:-1}" == "adapter" ]] || eval_run eval-base "$MODEL"
  # A LoRA adapter directory is a valid eval model too (merged on load): checks the sharing path end to end.
  first_lora="$OUT/${METHODS%% *}-lora"
  if [[ -f "$first_lora/adapter_config.json" ]]; then
    eval_run eval-adapter "$first_lora"
  fi
fi

# --- summary -----------------------------------------------------------------------------------------
echo
printf '%-28s %-6s %8s  %s\n' "RUN" "RESULT" "SECONDS" "LOG"
failed=0
for row in "${RESULTS[@]}"; do
  IFS='|' read -r name status secs log <<<"$row"
  printf '%-28s %-6s %8s  %s\n' "$name" "$status" "$secs" "$log"
  [[ "$status" == PASS ]] || failed=$((failed + 1))
done
echo
if (( failed > 0 )); then
  echo "gpu_smoke: $failed of ${#RESULTS[@]} runs FAILED (logs above; last lines of each: tail -n 30 <log>)"
  exit 1
fi
echo "gpu_smoke: all ${#RESULTS[@]} runs passed"
