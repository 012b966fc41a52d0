# kvscope: the two commands a newcomer needs are `make lab` and `make test`.
PY := .venv/bin/python
# setup.sh is idempotent but not instant (pip checks); re-run it only when what it
# installs from (requirements/lock.txt, pyproject.toml, itself) changes, or on an explicit `make setup`.
SETUP_STAMP := .venv/.kvscope-setup
LAB_STAMP := .venv/.kvscope-setup-lab

.PHONY: setup lock lab test test-fast e2e screenshot doctor docs

# Install everything: packages, the default model's wheel, Debian chromium for browser tests.
setup:
	bash scripts/setup.sh --with-browser
	@touch $(SETUP_STAMP)

$(SETUP_STAMP): pyproject.toml scripts/setup.sh requirements/lock.txt
	bash scripts/setup.sh --with-browser
	@touch $@

# The explorer needs no browser install (that is only for the tests): no root needed.
$(LAB_STAMP): pyproject.toml scripts/setup.sh requirements/lock.txt
	bash scripts/setup.sh
	@touch $@

# Re-resolve requirements/lock.txt (what setup.sh installs) to the newest versions that
# pyproject.toml and requirements/lock.in allow; then `make test`, and commit it if green.
lock:
	bash scripts/lock.sh

# Install (first time only), then open the walkthrough in JupyterLab with the default model.
lab: $(LAB_STAMP)
	$(PY) -m explorer lab

# Everything but the on-demand soak and GPU tests (see addopts in pyproject.toml).
test: $(SETUP_STAMP)
	$(PY) -m pytest

# The quick loop: no browser, nothing marked slow.
test-fast: $(SETUP_STAMP)
	$(PY) -m pytest -m "not e2e and not slow and not soak and not gpu"

# Only the real-browser tests.
e2e: $(SETUP_STAMP)
	$(PY) -m pytest -m e2e tests/e2e

# Regenerate docs/dashboard.png (the walkthrough) and docs/vllm_dashboard.png (the
# dashboard on vLLM) from real browser runs.
screenshot: $(SETUP_STAMP)
	KVSCOPE_UPDATE_SCREENSHOT=1 $(PY) -m pytest -m e2e -x -q tests/e2e/test_walkthrough.py tests/e2e/test_vllm_browser.py

doctor:
	$(PY) -m explorer doctor

# The documentation site in docs/site/ (entry: docs/site/index.html): executes the walkthrough
# on the real engine, records each chapter's replay, runs mkdocs strict. A subset:
# KVSCOPE_DOCS_CHAPTERS=2,3 make docs
docs: $(LAB_STAMP)
	$(PY) scripts/build_docs.py
