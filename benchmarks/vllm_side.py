"""vLLM's CPU build as the bench's second baseline, in a process of its own.

Its own process because vLLM, once imported, changes torch's threads and allocator for the
whole process, and its start-up (torch.compile: 70-100 s on 2 cores) should be paid once:
the child loads vLLM, then runs workloads as the parent asks, one JSON line each way, so
kvscope's and vLLM's repetitions alternate in time (this machine is shared and noisy) with
the same prompts, greedy, ignore_eos, prefix caching on and a fresh cache per run.
Between its own runs the child's process group is stopped (SIGSTOP): vLLM's engine core and
worker poll while idle (about 40% of a core on 2 cores), which would otherwise slow the sides
measured in between.

    parent -> child   {"prompts": [[ids]], "max_tokens": [n, ...]}   (or {"quit": true})
    child -> parent   {"seconds": s, "output_ids": [[ids]]}           (lines tagged RESULT_TAG)
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULT_TAG = "KVSCOPE-VLLM-BENCH "  # vLLM prints to stdout too: only tagged lines are ours
READY_TIMEOUT_S = 900                # torch.compile on a busy 2-core machine


class VllmBenchSide:
    """The parent's handle: start the child, `run(prompts, max_tokens)`, `close()`."""

    def __init__(self, model: str, dtype: str, kv_gib: int, eager: bool) -> None:
        from explorer.drivers.vllm.config import require_vllm

        self.version = require_vllm()
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=str(kv_gib))
        self._log = tempfile.NamedTemporaryFile("w+", prefix="vllm-bench-", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", "benchmarks.vllm_side", "--model", model, "--dtype", dtype]
        self.proc = subprocess.Popen(cmd + (["--eager"] if eager else []), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log, text=True, env=env,
                                     cwd=Path(__file__).resolve().parents[1], start_new_session=True)
        self.load_s = self._read()["load_s"]
        self._signal(signal.SIGSTOP)

    def run(self, prompts: list[list[int]], max_tokens: list[int]) -> tuple[float, list[list[int]]]:
        self._signal(signal.SIGCONT)
        try:
            self.proc.stdin.write(json.dumps({"prompts": prompts, "max_tokens": max_tokens}) + "\n")
            self.proc.stdin.flush()
            reply = self._read()
        finally:
            self._signal(signal.SIGSTOP)
        return reply["seconds"], reply["output_ids"]

    def _signal(self, sig: int) -> None:
        """To the child and the engine-core and worker processes vLLM started (its session)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def _read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(RESULT_TAG):
                return json.loads(line[len(RESULT_TAG):])
        self._log.seek(0)
        tail = self._log.read()[-3000:]
        raise RuntimeError(f"the vLLM bench process ended (exit {self.proc.wait()}); its log ends:\n{tail}")

    def close(self) -> None:
        self._signal(signal.SIGCONT)
        if self.proc.poll() is None:
            self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
            self.proc.stdin.flush()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._log.close()
        os.unlink(self._log.name)


def _serve(model: str, dtype: str, eager: bool) -> None:
    from explorer.drivers.vllm.config import prepare_environment

    prepare_environment()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"  # vLLM's own default: the fastest it runs
    from vllm import LLM, SamplingParams, TokensPrompt

    t0 = time.perf_counter()
    llm = LLM(model=model, dtype=dtype, enforce_eager=eager, enable_prefix_caching=True, seed=0)
    _reply({"load_s": time.perf_counter() - t0})
    for line in sys.stdin:
        ask = json.loads(line)
        if ask.get("quit"):
            return
        llm.reset_prefix_cache()  # repetitions must not hit each other (kvscope's side does the same)
        prompts = [TokensPrompt(prompt_token_ids=p) for p in ask["prompts"]]
        params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in ask["max_tokens"]]
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        _reply({"seconds": seconds, "output_ids": [list(o.outputs[0].token_ids) for o in outs]})


def _reply(obj: dict) -> None:
    sys.stdout.write(RESULT_TAG + json.dumps(obj) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="the vLLM side of `python -m benchmarks bench` (started by it)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", required=True)
    ap.add_argument("--eager", action="store_true", help="enforce_eager: no torch.compile (faster start)")
    args = ap.parse_args()
    _serve(args.model, args.dtype, args.eager)
