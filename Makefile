# kvscope: the two commands a newcomer needs are `make lab` and `make test`.
PY := .venv/bin/python

.PHONY: setup lab test screenshot

setup:
	bash scripts/setup.sh --with-browser

# Install (first time only), then open the walkthrough in JupyterLab with the default model.
lab:
	bash scripts/setup.sh
	$(PY) -m explorer lab

# Install everything the tests need (packages, default model, Debian chromium), then run them.
test: setup
	$(PY) -m pytest

# Regenerate docs/dashboard.png from a real browser run of the walkthrough.
screenshot: setup
	KVSCOPE_UPDATE_SCREENSHOT=1 $(PY) -m pytest tests/e2e -x -q
