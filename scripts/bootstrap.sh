#!/usr/bin/env bash
# Create .venv and install the locked dependencies (idempotent, fast when nothing changed).
#
#   scripts/bootstrap.sh           runtime and development dependencies (tests, lint)
#   scripts/bootstrap.sh runtime   runtime dependencies only (`make demo`)
#
# Prerequisites a bare Debian or Ubuntu lacks (git, the venv module) are installed with apt-get,
# through sudo when not root; where that is not possible the script names them and stops. A
# .venv that cannot run Python or pip (a half-made one) is made again.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE="${1:-dev}"
PY="${PYTHON:-python3}"

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null 2>&1; then sudo "$@"; else return 1; fi
}

need_packages() {  # $@: Debian/Ubuntu package names
  if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" -eq 0 ] || command -v sudo >/dev/null 2>&1; }; then
    echo "==> installing: $*"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
  else
    echo "Loopwright needs these packages first: $* (install them as root, e.g. apt-get install $*)" >&2
    exit 1
  fi
}

if ! command -v "$PY" >/dev/null 2>&1; then
  need_packages python3 python3-venv
fi
if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
  echo "Loopwright needs Python >= 3.11 (found: $("$PY" --version 2>&1)). Set PYTHON=/path/to/python3.11+." >&2
  exit 1
fi
missing=()
command -v git >/dev/null 2>&1 || missing+=(git)
# Debian and Ubuntu ship the venv module (with ensurepip) apart from python3.
"$PY" -c 'import ensurepip, venv' 2>/dev/null || missing+=("python3-venv")
if [ "${#missing[@]}" -gt 0 ]; then
  need_packages "${missing[@]}"
fi

if [ -e .venv ] && ! { .venv/bin/python -c 'import sys' && .venv/bin/python -m pip --version; } >/dev/null 2>&1; then
  echo "==> .venv is broken (no working python or pip): making it again"
  rm -rf .venv
fi
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv with $("$PY" --version)"
  "$PY" -m venv .venv
fi
if [ ! -x .venv/bin/uv ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "uv==0.13.8"
fi

hash=$(sha256sum uv.lock pyproject.toml | sha256sum | cut -c1-16)
extras=(--extra dev)
if [ "$MODE" = runtime ]; then
  extras=()
  # The development install holds the runtime one.
  [ -f ".venv/.synced-$hash-dev" ] && exit 0
fi
stamp=".venv/.synced-$hash-$MODE"
if [ ! -f "$stamp" ]; then
  echo "==> installing locked dependencies (uv.lock, $MODE)"
  # --inexact keeps optional extras (e.g. `make bench`'s peer) that are already installed.
  UV_PROJECT_ENVIRONMENT=.venv .venv/bin/uv sync --frozen --inexact "${extras[@]}" ${EXTRAS:-} \
    --python .venv/bin/python --quiet --compile-bytecode
  rm -f .venv/.synced-* && touch "$stamp"
fi
# Bytecode for every process started from here (web, workers, CLI, the tests' subprocesses):
# where PYTHONDONTWRITEBYTECODE is set Python never caches it, and each start would compile
# every module again (1.7 s of a worker's start). The dependencies' is made by the install
# above; Loopwright's own here, only for files changed since (a fraction of a second).
packages=()
for init in */__init__.py; do packages+=("${init%/__init__.py}"); done
.venv/bin/python -m compileall -q -j 0 "${packages[@]}" manage.py >/dev/null
