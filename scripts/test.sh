#!/usr/bin/env bash
# The whole test suite: lint, types, then the tests on SQLite and again on PostgreSQL + Redis.
#
#   make test                      # what the README says
#   REQUIRE_SERVICES=1 make test   # CI: missing PostgreSQL or Redis is a failure, not a skip
#   PYTEST_ARGS="-k claims" make test
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh || exit 1
if [ "$(id -u)" = 0 ]; then
  scripts/install-system-deps.sh || exit 1  # bubblewrap & co. for the sandbox tests
else
  echo "note: not root; system packages (scripts/install-system-deps.sh) are not installed" >&2
fi
export PATH="$PWD/.venv/bin:$PATH"
PG_URL="${TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/loopwright}"
REDIS_BASE="${TEST_REDIS_URL:-redis://127.0.0.1:6379}"
failed=()
skipped=()

step() { printf '\n==> %s\n' "$*"; }

run_pytest() {  # $1 = label, then the command prefix (env settings) for pytest
  local label=$1 rc=0
  shift
  # --durations: the slowest tests in every log, to keep CI well under its time budget.
  "$@" pytest -n 2 --durations=20 ${PYTEST_ARGS:-} || rc=$?
  if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests for $label: that is a failure" >&2
  fi
  [ "$rc" -eq 0 ] || failed+=("$label (pytest exit $rc)")
}

# Why PostgreSQL cannot be queried as the suite connects (PG_URL's server and user, its
# "postgres" database); "" when it can. A refused password is named, not mistaken for a crash.
pg_problem() {
  .venv/bin/python - "$PG_URL" <<'EOF' 2>&1
import sys
from urllib.parse import urlsplit, urlunsplit

import psycopg

url = urlunsplit(urlsplit(sys.argv[1])._replace(path="/postgres"))
try:
    with psycopg.connect(url, connect_timeout=3) as connection:
        connection.execute("SELECT 1")
except Exception as exc:  # any failure is the answer
    lines = str(exc).strip().splitlines()
    print(lines[0] if lines else type(exc).__name__)
EOF
}
pg_up() { [ -z "$(pg_problem)" ]; }
redis_up() { [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = "PONG" ]; }

start_services() {
  if ! pg_up && command -v pg_ctlcluster >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    step "starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | tail -1)" main start || true
    for _ in $(seq 1 30); do pg_up && break; sleep 0.5; done
  fi
  if ! redis_up && command -v redis-server >/dev/null 2>&1; then
    step "starting Redis"
    mkdir -p var/redis
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
      --dir "$PWD/var/redis" --logfile "$PWD/var/redis/redis.log" || true
    for _ in $(seq 1 30); do redis_up && break; sleep 0.2; done
  fi
}

step "ruff check"
ruff check . || failed+=("ruff check")
step "ruff format --check"
ruff format --check . || failed+=("ruff format")
step "mypy"
mypy . || failed+=("mypy")
step "import contracts (docs/architecture.md)"
lint-imports --no-cache || failed+=("import contracts")
step "deploy files (hadolint, kubernetes-validate, compose schema)"
scripts/check-deploy.sh || failed+=("deploy files")

start_services
services=no
pg_up && redis_up && services=yes
# With the servers answering, the tests no backend changes (`one_backend`) wait for their phase:
# each runs once (tests/support/phases.py); without them everything runs on SQLite.
embedded_phase=()
[ "$services" = yes ] && embedded_phase=(LOOPWRIGHT_TEST_PHASE=embedded)

step "tests on SQLite (embedded default)"
run_pytest "SQLite suite" env -u DATABASE_URL -u CELERY_BROKER_URL -u REDIS_URL \
  LOOPWRIGHT_VAR_DIR="$PWD/var/test-sqlite" "${embedded_phase[@]}"

if [ "$services" = yes ] && pg_up && redis_up; then
  # The tests that touch neither a database nor Redis answered for good in the SQLite phase
  # (tests/support/phases.py); this phase runs the rest again on the servers.
  step "tests on PostgreSQL + Redis (those that touch a database or Redis)"
  run_pytest "PostgreSQL + Redis suite" env LOOPWRIGHT_VAR_DIR="$PWD/var/test-postgres" \
    LOOPWRIGHT_TEST_PHASE=services \
    DATABASE_URL="$PG_URL" CELERY_BROKER_URL="$REDIS_BASE/2" REDIS_URL="$REDIS_BASE/2"
  # The engine's fast paths and real workers again, through a real PgBouncer in transaction
  # pooling (docs/operations.md); the whole engine and e2e suite: scripts/pgbouncer-suite.sh.
  if command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]; then
    step "engine and end-to-end tests through PgBouncer (transaction pooling, a subset)"
    scripts/pgbouncer-suite.sh --ci ${PYTEST_ARGS:-} || failed+=("PgBouncer subset")
  else
    msg="PgBouncer subset NOT RUN: pgbouncer is not installed (scripts/install-system-deps.sh)"
    skipped+=("$msg")
    [ "${REQUIRE_SERVICES:-0}" = 1 ] && failed+=("$msg (REQUIRE_SERVICES=1)")
  fi
else
  why=()
  problem=$(pg_problem)
  [ -z "$problem" ] || why+=("PostgreSQL cannot be queried (TEST_POSTGRES_URL): $problem")
  redis_up || why+=("no Redis answers at 127.0.0.1:6379")
  msg="PostgreSQL + Redis suite NOT RUN: $(IFS=';'; echo "${why[*]}")"
  skipped+=("$msg")
  [ "${REQUIRE_SERVICES:-0}" = 1 ] && failed+=("$msg (REQUIRE_SERVICES=1)")
  # The SQLite phase left the one_backend tests to this phase: now nothing ran them.
  [ "$services" = yes ] && failed+=("$msg after the SQLite phase: the one_backend tests never ran")
fi

echo
for s in "${skipped[@]}"; do echo "SKIPPED: $s"; done
if [ ${#failed[@]} -gt 0 ]; then
  for f in "${failed[@]}"; do echo "FAILED: $f"; done
  exit 1
fi
echo "All checks passed."
