"""kvscope's scheduling core runs where only Python does (a browser's Pyodide, issue 61): the
scheduler, KV cache manager and block pool import without torch, numpy or the xxhash C
extension, and then decide exactly as with them, their block hashes from engine/core/xxh64.py,
checked against the extension."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import xxhash

from engine.core.xxh64 import xxh64_intdigest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("seed", [0, 1, 12345, (1 << 64) - 1])
def test_xxh64_in_python_equals_the_c_extension(seed):
    rng = random.Random(seed % 1000)
    for n in [*range(0, 80), 127, 128, 129, 136, 264, 1000, 4099]:   # every tail: 0-31 bytes after the stripes
        data = bytes(rng.randrange(256) for _ in range(n))
        assert xxh64_intdigest(data, seed) == xxhash.xxh64_intdigest(data, seed=seed), (n, seed)


# Runs a seeded workload through kvscope's core and prints every step's decisions and the cached
# blocks' hashes; `--bare` first makes torch, numpy and xxhash unimportable.
RUN = r'''
import json, sys
if "--bare" in sys.argv:
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "numpy", "xxhash", "transformers"):
                raise ImportError(f"{name} is not here (a Python without it)")
    sys.meta_path.insert(0, Block())
from tests.oracle.kvscope_side import KvscopeScheduler
from tests.oracle.workloads import random_workload
import engine.core.hashing as hashing
out = {"hash": hashing.xxh64_intdigest.__module__, "runs": [],
       "loaded": sorted({m.split(".")[0] for m in sys.modules} & {"torch", "numpy", "xxhash"})}
for seed in range(6):
    w = random_workload(seed)
    k = KvscopeScheduler(w)
    pending = sorted(w.requests, key=lambda r: r.arrival_step)
    steps, step = [], 0
    while pending or k.scheduler.waiting or k.scheduler.running:
        while pending and pending[0].arrival_step <= step:
            k.add(pending.pop(0))
        steps.append(k.step())
        step += 1
    hashes = [b.block_hash for b in k.kv.pool.blocks if b.block_hash is not None]
    out["runs"].append({"steps": steps, "state": k.state(), "hashes": hashes})
print(json.dumps(out))
'''


def _run(*args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", RUN, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_core_decides_the_same_without_torch_numpy_or_the_xxhash_extension():
    bare, full = _run("--bare"), _run()
    assert bare["loaded"] == [] and bare["hash"] == "engine.core.xxh64"
    assert full["hash"].startswith("xxhash")
    assert sum(len(r["hashes"]) for r in full["runs"]) > 0   # the workloads cached (and so hashed) blocks
    assert bare["runs"] == full["runs"]
