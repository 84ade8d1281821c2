# Loopwright: the two commands of the README, and a few more for developers.
.PHONY: demo test bench lint fmt migrate

demo:  ## install what is missing, migrate, seed the demo, start web + worker + scheduler
	@scripts/demo.sh

test:  ## lint, types, the deploy files, and the whole test suite on SQLite and PostgreSQL + Redis
	@scripts/test.sh

bench:  ## every benchmark, printed as a table (JSON under bench/results/); installs the peer
	@scripts/bootstrap.sh && UV_PROJECT_ENVIRONMENT=.venv .venv/bin/uv sync --frozen --inexact \
		--extra dev --extra bench --python .venv/bin/python --quiet && .venv/bin/python -m bench

lint:  ## ruff, formatting, mypy, the import contracts (docs/architecture.md), the deploy files
	@scripts/bootstrap.sh && .venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy . \
		&& .venv/bin/lint-imports --no-cache && scripts/check-deploy.sh

fmt:
	@.venv/bin/ruff format . && .venv/bin/ruff check --fix .
