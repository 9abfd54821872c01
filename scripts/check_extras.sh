#!/usr/bin/env bash
# The extras, each installed in a fresh venv from one wheel of the working tree: the core alone
# imports without either framework, and the adapters, the server and `relaygen serve|bench` say
# which extra to install; `[langchain]` imports relay_integrations.langchain and brings no
# LlamaIndex; `[llama-index]` the reverse. The project venv (all extras) must not load them
# from the core either. The wheel's build must not warn. scripts/test runs it before pytest.
#
#   scripts/check_extras.sh       about 35 s (pip's cache is reused; the venvs are rebuilt)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO"
started=$SECONDS
work="$REPO/.cache/extras-check"

ensure_project_venv dev
rm -rf "$work"
mkdir -p "$work"

echo "[extras] building the wheel"
if ! "$PROJECT_VENV/bin/python" -m pip wheel --no-deps -v -w "$work/dist" . >"$work/build.log" 2>&1; then
  cat "$work/build.log" >&2
  echo "[extras] FAILED: the wheel does not build" >&2
  exit 1
fi
# Python warnings of the build backend (e.g. "BuildBackendWarning: `project.license` as a TOML
# table is deprecated"); pip's own "WARNING: Location ..." lines are not the project's.
if grep -E '[A-Za-z]+Warning: ' "$work/build.log" >&2; then
  echo "[extras] FAILED: the build warns (full log: $work/build.log)" >&2
  exit 1
fi
wheel="$(echo "$work"/dist/relay_integrations-*.whl)"

# check INSTALL [EXTRA]: a fresh venv with the wheel (and EXTRA), then scripts/check_extras.py.
# The venv has no pip of its own: the project venv's pip installs into it (--python).
check() {
  local install="$1" extra="${2:-}" venv="$work/$1"
  "${RELAY_PYTHON:-python3}" -m venv --without-pip "$venv"
  if ! "$PROJECT_VENV/bin/python" -m pip --python "$venv/bin/python" install --quiet \
    --disable-pip-version-check "$wheel${extra:+[$extra]}" >"$venv.log" 2>&1; then
    grep -v "is ignored: it is neither" "$venv.log" >&2
    echo "[extras] FAILED: pip install $(basename "$wheel")${extra:+[$extra]}" >&2
    exit 1
  fi
  echo "[extras] $install: $("$PROJECT_VENV/bin/python" -m pip --python "$venv/bin/python" list \
    --format=freeze 2>/dev/null | wc -l) packages"
  "$venv/bin/python" scripts/check_extras.py "$install"
}

check core
check langchain langchain
check llama-index llama-index
"$PROJECT_VENV/bin/python" scripts/check_extras.py dev
rm -rf "$work"
echo "[extras] passed in $((SECONDS - started)) s"
