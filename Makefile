# Canopy: `make run` serves the dashboard with a live demo; `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install run serve test test-postgres lint format bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

# Migrate, create the demo operator and runner, then serve with a scripted runner growing trees.
run: install
	$(PY) manage.py migrate --noinput
	$(PY) manage.py demo --host $(HOST) --port $(PORT)

# The server alone, without the demo runner.
serve: install
	$(PY) manage.py migrate --noinput
	$(PY) -m canopy.serving $(HOST) $(PORT)

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

# The same suite on the scale-out backends (the machine's PostgreSQL and Redis).
test-postgres: install
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres} \
	REDIS_URL=$${REDIS_URL:-redis://127.0.0.1:6379/0} \
	$(PY) -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: install
	$(PY) -m bench

clean:
	rm -rf var/canopy-test-*.sqlite3* test-results
