# Cardhour: `make run` starts the platform on embedded defaults; `make test` runs the test suite.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PORT   ?= 8000

.PHONY: install lock run test lint typecheck layers check clean messages

# Every package at the version and hash requirements.lock pins (the dev and prod extras included), then the
# project itself without resolving anything again. `make lock` rewrites the lock after pyproject.toml changes.
$(STAMP): pyproject.toml requirements.lock
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --require-hashes -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	@touch $(STAMP)

install: $(STAMP)

lock: $(STAMP)
	$(BIN)/uv pip compile pyproject.toml --extra dev --extra prod --generate-hashes --universal \
		--python-version 3.11 --quiet -o requirements.lock

# Migrate the embedded SQLite database in var/, load the demo (idempotent), then run the web server, a
# Celery worker, Celery beat and the simulated operator agents under honcho. Ctrl-C stops them all.
# Entry points default to the production settings (config/entrypoint.py): the embedded stack asks for local.
run: export DJANGO_SETTINGS_MODULE = config.settings.local
run: $(STAMP)
	@mkdir -p var
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py seed_demo --port $(PORT)
	$(BIN)/python manage.py seed_billing_demo
	$(BIN)/python manage.py seed_broker_demo
	CARDHOUR_PORT=$(PORT) PATH="$(abspath $(BIN)):$$PATH" $(BIN)/honcho --procfile Procfile.dev start

# Translations: extract every marked string (templates into locale/, each app's Python strings into
# <app>/locale/), then compile. Translate the new entries in between; tests/core/test_translations.py fails on
# an untranslated, fuzzy or stale entry. The .mo files are committed: `make run` and installs need no gettext.
messages: export DJANGO_SETTINGS_MODULE = config.settings.local
messages: $(STAMP)
	$(BIN)/python manage.py makemessages -l zh_Hans --no-obsolete
	$(BIN)/python manage.py compilemessages -l zh_Hans --ignore=.venv

# SQLite unless DATABASE_URL is set; PostgreSQL-only tests are skipped with their reason on SQLite.
# Extra pytest options go in PYTEST_ARGS, e.g. `make test PYTEST_ARGS="-x -k heartbeat"`.
test: $(STAMP)
	$(BIN)/pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy .

layers: $(STAMP)
	$(BIN)/lint-imports

check: lint typecheck layers test

clean:
	rm -rf $(VENV) var
