#!/usr/bin/env bash
# Part of the test suite through a real PgBouncer (pool_mode = transaction) on loopback, with
# LOOPWRIGHT_DB_POOLER=transaction (docs/operations.md, "PgBouncer").
#
#   scripts/pgbouncer-suite.sh                              # the engine and end-to-end tests
#   scripts/pgbouncer-suite.sh --ci                         # the subset `make test` runs (~1 min)
#   scripts/pgbouncer-suite.sh tests/loops/test_claims.py   # any pytest arguments
#   PYTEST_WORKERS=1 scripts/pgbouncer-suite.sh ...          # xdist workers (default 2)
#
# PgBouncer (Debian: apt-get install pgbouncer) listens on a free port in front of
# PGBOUNCER_UPSTREAM (default 127.0.0.1:5432) and is stopped at the end. Its own database name
# and Redis databases keep it apart from a `make test` running at the same time.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
UPSTREAM="${PGBOUNCER_UPSTREAM:-127.0.0.1:5432}"
REDIS_BASE="${TEST_REDIS_URL:-redis://127.0.0.1:6379}"
log="$(mktemp)"
python -m tests.support.pgbouncer --upstream "$UPSTREAM" >"$log" 2>&1 &
bouncer=$!
trap 'kill "$bouncer" 2>/dev/null; wait "$bouncer" 2>/dev/null; rm -f "$log"' EXIT
port=""
for _ in $(seq 1 150); do
  port="$(sed -n 's/^PGBOUNCER_PORT=//p' "$log")"
  [ -n "$port" ] && break
  kill -0 "$bouncer" 2>/dev/null || break
  sleep 0.1
done
if [ -z "$port" ]; then
  cat "$log" >&2
  echo "pgbouncer did not start" >&2
  exit 1
fi
echo "pgbouncer (transaction pooling) on 127.0.0.1:$port in front of $UPSTREAM"
# The subset `make test` runs: every fast path of the engine (claims, journal writes, ends,
# budgets, approvals, lock waits, the unprepared batches) and real worker processes end to end.
CI_SUBSET=(
  tests/loops/test_claims.py tests/loops/test_claim_starts_runs.py tests/loops/test_write_paths.py
  tests/loops/test_db_batch.py tests/loops/test_journal_numbering.py tests/loops/test_resume_reads.py
  tests/loops/test_transitions.py tests/loops/test_budgets.py tests/loops/test_budgets_concurrency.py
  tests/loops/test_run_endings.py tests/loops/test_approvals.py tests/loops/test_lock_waits.py
  tests/loops/test_driver_poll.py tests/test_sql_prepared.py tests/test_operations_pooler.py
  tests/e2e/test_engine_e2e.py tests/e2e/test_approvals_e2e.py tests/e2e/test_worker_smoke.py
)
if [ "${1:-}" = "--ci" ]; then
  shift
  set -- "${CI_SUBSET[@]}" "$@"
fi
[ $# -gt 0 ] || set -- tests/loops tests/e2e tests/test_sql_prepared.py tests/test_operations_pooler.py
env LOOPWRIGHT_VAR_DIR="$PWD/var/test-pgbouncer" LOOPWRIGHT_TEST_PHASE=services \
  LOOPWRIGHT_DB_POOLER=transaction \
  DATABASE_URL="postgres://postgres@127.0.0.1:$port/loopwright_pgbouncer" \
  LOOPWRIGHT_TEST_PGBOUNCER_ADMIN_URL="postgres://postgres@127.0.0.1:$port/pgbouncer" \
  CELERY_BROKER_URL="$REDIS_BASE/4" REDIS_URL="$REDIS_BASE/4" \
  pytest -n "${PYTEST_WORKERS:-2}" --durations=10 "$@"
