# The two commands: `make demo` (the main job) and `make test` (the whole suite).
# Each creates .venv and installs what it needs on a fresh machine (Python 3.11+, make):
# `make demo` only the service and the demo extra (.installed-demo), `make test` and the
# other targets the whole toolchain as well (.installed; it satisfies the demo too).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: demo test install lint typecheck docs schema helm-template image-check clean

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "fanout needs Python 3.11+")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,otel,fast,docs]'
	touch $(STAMP) $(DEMO_STAMP)

# The demo's own install: the service and the `demo` extra, no test or docs toolchain.
# A full install (above) already covers it.
$(DEMO_STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "fanout needs Python 3.11+")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[demo]'
	touch $(DEMO_STAMP)

install: $(STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/fanout demo $(ARGS)

lint: install
	$(BIN)/ruff check schema infra worker publisher tools client tests bench docs/hooks fanout_cli.py

typecheck: install
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/pytest $(PYTEST_ARGS)

# The documentation site (mkdocs.yml, docs/) into site/; any warning fails the build.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

schema: install
	$(BIN)/python -m schema.jsonschema

# Print the chart's manifests without a helm binary: make helm-template ARGS="-f my-values.yaml"
helm-template: install
	@$(BIN)/python scripts/helm_template.py $(ARGS)

# Build the Dockerfile with buildah on a Debian base and run the image (root; see scripts/).
image-check:
	bash scripts/image_check.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis site
