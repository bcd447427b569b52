# Canopy: `make run` serves the dashboard with a live demo; `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000

# oidc-provider: see the single sign-on block below.
.PHONY: install agents oidc-provider phoenix run demo-agents serve test test-postgres lint wheel-check format bench clean clean-agents

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

# Coding-agent CLIs the agent tests drive, pinned and kept in the project's own folder so the
# tests never depend on (or pick up) whatever the machine has installed globally.
AGENTS_DIR := .agents
CLAUDE_CODE_VERSION := 2.1.332
# The ACP adapter: claude-agent-acp, the successor of claude-code-acp (frozen at 0.16.2); it
# runs offline on the scripted endpoint like its predecessor.
CLAUDE_AGENT_ACP_VERSION := 0.23.1
# Issue 23: the other coding agents Canopy runs as real children (each pinned; native ones ship
# their binary as an optional npm dependency for this platform).
CODEX_VERSION := 0.171.0
GEMINI_CLI_VERSION := 0.61.0
COPILOT_CLI_VERSION := 1.0.102
AGENT_PINS := $(CLAUDE_CODE_VERSION)-$(CLAUDE_AGENT_ACP_VERSION)-$(CODEX_VERSION)-$(GEMINI_CLI_VERSION)-$(COPILOT_CLI_VERSION)
AGENTS_STAMP := $(AGENTS_DIR)/.installed-$(AGENT_PINS)

$(AGENTS_STAMP):
	@mkdir -p $(AGENTS_DIR)
	@test -f $(AGENTS_DIR)/package.json || echo '{"name": "canopy-agents", "private": true}' > $(AGENTS_DIR)/package.json
	cd $(AGENTS_DIR) && npm install --no-audit --no-fund --save-exact \
		@anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION) \
		@zed-industries/claude-agent-acp@$(CLAUDE_AGENT_ACP_VERSION) \
		@openai/codex@$(CODEX_VERSION) \
		@google/gemini-cli@$(GEMINI_CLI_VERSION) \
		@github/copilot@$(COPILOT_CLI_VERSION)
	$(AGENTS_DIR)/node_modules/.bin/claude --version
	$(AGENTS_DIR)/node_modules/.bin/codex --version
	$(AGENTS_DIR)/node_modules/.bin/gemini --version
	$(AGENTS_DIR)/node_modules/.bin/copilot --version
	@rm -f $(AGENTS_DIR)/.installed-*
	@touch $(AGENTS_STAMP)

agents: $(AGENTS_STAMP)

# Issue 38: `make demo-agents` runs Claude Code only, so it installs that CLI alone (pinned as
# above, into the same folder); `make agents` still installs all five for the tests.
CLAUDE_STAMP := $(AGENTS_DIR)/.installed-claude-$(CLAUDE_CODE_VERSION)

$(CLAUDE_STAMP):
	@mkdir -p $(AGENTS_DIR)
	@test -f $(AGENTS_DIR)/package.json || echo '{"name": "canopy-agents", "private": true}' > $(AGENTS_DIR)/package.json
	@test -f $(AGENTS_STAMP) || (cd $(AGENTS_DIR) && npm install --no-audit --no-fund --save-exact --loglevel=error \
		@anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION))
	@$(AGENTS_DIR)/node_modules/.bin/claude --version
	@rm -f $(AGENTS_DIR)/.installed-claude-*
	@touch $(CLAUDE_STAMP)

agent-claude: $(CLAUDE_STAMP)
.PHONY: agent-claude

# Single sign-on tests (issue 28): the certified OpenID provider on Node they sign in through,
# pinned by tests/support/oidc/package-lock.json and installed in that folder only.
OIDC_DIR := tests/support/oidc
OIDC_STAMP := $(OIDC_DIR)/node_modules/.installed

$(OIDC_STAMP): $(OIDC_DIR)/package.json $(OIDC_DIR)/package-lock.json
	cd $(OIDC_DIR) && npm ci --no-audit --no-fund
	@touch $(OIDC_STAMP)

oidc-provider: $(OIDC_STAMP)

# The settings refuse the development SECRET_KEY with DEBUG off: without one in the
# environment, run and serve use a random key made once for this checkout (owner-only file),
# named by SECRET_KEY_FILE so the key itself is in no process's environment.
DEV_KEY := var/dev-secret-key
KEYED := $(if $(SECRET_KEY)$(SECRET_KEY_FILE),,SECRET_KEY_FILE=$(CURDIR)/$(DEV_KEY))

$(DEV_KEY):
	@mkdir -p var && umask 077 && $(PY) -c 'import secrets; print(secrets.token_urlsafe(50))' > $@

# Migrate, create the demo operator and runner, then serve with a scripted runner growing trees;
# with PRESETS=file.json (ENGINE=acp, ROOT="a task", PROFILE=name) real agents run instead.
# Issue 38: install and migrate say nothing unless something fails, so the demo's sign-in
# block (its one-time password) is the last thing printed before the server's own lines.
run: install $(DEV_KEY)
	@$(KEYED) $(PY) manage.py migrate --noinput -v 0
	@$(KEYED) $(PY) manage.py demo --host $(HOST) --port $(PORT) \
	  $(if $(PRESETS),--presets '$(PRESETS)') $(if $(ENGINE),--engine $(ENGINE)) \
	  $(if $(ROOT),'--root=$(ROOT)') $(if $(PROFILE),--root-profile '$(PROFILE)')

# Real Claude Code (the CLI `make agents` pins, first on PATH) growing a tree offline: the server,
# the scripted model endpoint on 127.0.0.1:$(MODEL_PORT) (the port the presets name) and a
# runner with deploy/presets/demo-claude.json, which opens one root at start. Ctrl-C stops all.
MODEL_PORT ?= 8765
DEMO_PRESETS ?= deploy/presets/demo-claude.json
DEMO_ROOT := [root] Grow a small demo tree
# The agents work here, not in the checkout: an agent there would read the server's secrets.
DEMO_WORKSPACE ?= $(HOME)/.cache/canopy-demo/workspace
# The presets name the model endpoint 127.0.0.1:8765; another MODEL_PORT gets a copy naming it
# (issue 38: moving the port needed a hand-edited copy).
DEMO_PRESETS_RUN := var/demo-presets-$(MODEL_PORT).json
demo-agents: install agent-claude $(DEV_KEY)
	@$(KEYED) $(PY) manage.py migrate --noinput -v 0
	@mkdir -p var && sed 's/127\.0\.0\.1:8765/127.0.0.1:$(MODEL_PORT)/g' '$(DEMO_PRESETS)' > $(DEMO_PRESETS_RUN)
	@PATH="$(CURDIR)/$(AGENTS_DIR)/node_modules/.bin:$$PATH" $(KEYED) $(PY) manage.py demo \
	  --host $(HOST) --port $(PORT) --presets '$(DEMO_PRESETS_RUN)' --model-stub $(MODEL_PORT) \
	  '--root=$(DEMO_ROOT)' --root-profile claude --workspace '$(DEMO_WORKSPACE)' --lease-runner

# The server alone, without the demo runner.
serve: install $(DEV_KEY)
	$(KEYED) $(PY) manage.py migrate --noinput
	$(KEYED) $(PY) -m canopy.serving $(HOST) $(PORT)

# CANOPY_NO_SKIPS=1 makes a skipped test fail (as .ci/run does); -rs lists skips either way.
test: install agents phoenix oidc-provider
	$(PY) -m pytest $(PYTEST_ARGS)

# The same suite on the scale-out backends (the machine's PostgreSQL and Redis).
test-postgres: install agents phoenix oidc-provider
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres} \
	REDIS_URL=$${REDIS_URL:-redis://127.0.0.1:6379/0} \
	$(PY) -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

# The wheel, installed into a fresh virtual environment outside the checkout, must migrate,
# serve and connect a runner (CI runs it after lint).
wheel-check: install
	.ci/wheel-check

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: install
	$(PY) -m bench

clean:
	rm -rf var/canopy-test-*.sqlite3* test-results build *.egg-info

# Also drop the installed agent CLIs (make agents brings them back).
clean-agents:
	rm -rf $(AGENTS_DIR)

# Arize Phoenix, the real OTLP backend the trace-export tests (tests/tracing/) send to and read
# back from. Heavy, and its pins conflict with the project's, so it lives in its own venv; the
# tests start `.phoenix-venv/bin/phoenix serve` themselves on a free loopback port.
PHOENIX_VENV := .phoenix-venv
PHOENIX_VERSION := 20.26.1
PHOENIX_STAMP := $(PHOENIX_VENV)/.installed-$(PHOENIX_VERSION)

$(PHOENIX_STAMP):
	@test -x $(PHOENIX_VENV)/bin/python || $(PYTHON) -m venv $(PHOENIX_VENV)
	$(PHOENIX_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PHOENIX_VENV)/bin/python -m pip install --quiet 'arize-phoenix==$(PHOENIX_VERSION)'
	@rm -f $(PHOENIX_VENV)/.installed-*
	@touch $(PHOENIX_STAMP)

phoenix: $(PHOENIX_STAMP)
