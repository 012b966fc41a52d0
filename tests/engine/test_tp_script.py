"""Tensor parallel from a plain Python script, run as a person runs one: `python script.py`.

A script that makes `LLM(..., tensor_parallel_size=2)` at its top level, with no
`if __name__ == "__main__":` guard, used to fail with EOFError (multiprocessing's spawn
re-ran the script in each worker), and every TP run ended with a "leaked semaphore objects"
warning. Both forms must generate, exit 0, and print nothing of the kind on stderr.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from engine import LLM, SamplingParams

REPO = Path(__file__).resolve().parents[2]
PROMPT = "The capital of France is"

# argv: the model folder, the repository root. The sys.path line stands in for an installed
# kvscope; the workers must find the engine on their own (the test sets no PYTHONPATH).
SCRIPTS = {
    "no_guard": """
import sys
sys.path.insert(0, sys.argv[2])
from engine import LLM, SamplingParams

llm = LLM(model=sys.argv[1], tensor_parallel_size=2, num_kv_blocks=16)
out = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True), use_tqdm=False)
print(out[0].token_ids)
""",
    "guard": """
import sys
sys.path.insert(0, sys.argv[2])
from engine import LLM, SamplingParams


def main():
    llm = LLM(model=sys.argv[1], tensor_parallel_size=2, num_kv_blocks=16)
    out = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    print(out[0].token_ids)


if __name__ == "__main__":
    main()
""",
}


def test_plain_scripts_with_and_without_guard_generate_with_tensor_parallel(tiny_qwen3_path, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["KVSCOPE_QUIET"] = "1"
    runs = {}
    for form, text in SCRIPTS.items():  # both at once: most of each run is importing torch
        script = tmp_path / f"{form}.py"
        script.write_text(text.replace("PROMPT", repr(PROMPT)))
        runs[form] = subprocess.Popen([sys.executable, str(script), str(tiny_qwen3_path), str(REPO)], cwd=tmp_path,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = {}
    try:
        expected = LLM(str(tiny_qwen3_path), num_kv_blocks=16).generate(
            [PROMPT], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True), use_tqdm=False)[0].token_ids
        for form, proc in runs.items():
            results[form] = proc.communicate(timeout=300)
    finally:
        for proc in runs.values():
            proc.kill()
            proc.wait()
    for form, (stdout, stderr) in results.items():
        assert runs[form].returncode == 0, f"{form}.py failed:\n{stderr}"
        for bad in ("bootstrapping", "leaked semaphore", "Traceback"):
            assert bad not in stderr, f"{form}.py printed {bad!r}:\n{stderr}"
        assert ast.literal_eval(stdout.strip().splitlines()[-1]) == expected, f"{form}.py: {stdout}"
