#!/usr/bin/env bash
# The README's first command: install what is missing, migrate, seed the demo and start
# web + worker + scheduler in the foreground on the embedded default (SQLite, no servers).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh runtime  # the demo needs no test or lint tools
PY=.venv/bin/python
$PY manage.py migrate --noinput -v 0
$PY manage.py seed_demo
exec $PY manage.py up "$@"
