#!/usr/bin/env bash
# Create .venv and install the locked dependencies (idempotent, fast when nothing changed).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
  echo "Loopwright needs Python >= 3.11 (found: $("$PY" --version 2>&1)). Set PYTHON=/path/to/python3.11+." >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv with $("$PY" --version)"
  "$PY" -m venv .venv
fi
if [ ! -x .venv/bin/uv ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "uv==0.13.8"
fi
stamp=.venv/.synced-$(sha256sum uv.lock pyproject.toml | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  echo "==> installing locked dependencies (uv.lock)"
  # --inexact keeps optional extras (e.g. `make bench`'s peer) that are already installed.
  UV_PROJECT_ENVIRONMENT=.venv .venv/bin/uv sync --frozen --inexact --extra dev ${EXTRAS:-} \
    --python .venv/bin/python --quiet
  rm -f .venv/.synced-* && touch "$stamp"
fi
