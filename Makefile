# The two commands a newcomer needs: `make demo` and `make test`. Both set everything up.
UV_VERSION := 0.13.8
UV := .tools/bin/uv
VENV := .venv

.PHONY: demo test lint typecheck unit bench clean

demo: $(VENV)/.synced
	$(VENV)/bin/ratchet demo

test: lint typecheck unit

lint: $(VENV)/.synced
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(VENV)/.synced
	$(VENV)/bin/mypy

unit: $(VENV)/.synced
	$(VENV)/bin/pytest -n 2 --durations=15

bench: $(VENV)/.synced
	$(VENV)/bin/python -m bench.step_cost

$(UV):
	python3 -m venv .tools
	.tools/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

$(VENV)/.synced: $(UV) pyproject.toml uv.lock
	$(UV) sync --frozen --extra dev --compile-bytecode
	touch $@

clean:
	rm -rf $(VENV) .tools .ratchet .mypy_cache .ruff_cache .pytest_cache
