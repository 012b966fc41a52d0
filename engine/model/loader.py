"""Loads Hugging Face safetensors into CausalLM, packing q/k/v and gate/up on the way.
A tensor-parallel rank reads only its own slice of each split weight (safe_open's
get_slice); only the small replicated tensors (norms) are read whole on every rank."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open

from ..parallel.sharding import shard_bounds, split_dim
from ..progress import progress
from .decoder import CausalLM

# HF name fragment -> (our packed parameter, shard index). Shard offsets come from the shapes.
PACKED_MODULES = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


def safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / n for n in names]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"model folder {folder} has no *.safetensors file")
    return files


def _shard_range(model: CausalLM, packed: str, shard: int) -> tuple[int, int]:
    s, n = model.spec, model.tp.size  # this rank's share of heads / MLP rows
    if packed == "qkv_proj":
        sizes = [s.num_heads // n * s.head_dim, s.num_kv_heads // n * s.head_dim, s.num_kv_heads // n * s.head_dim]
    else:
        sizes = [s.intermediate_size // n] * 2
    start = sum(sizes[:shard])
    return start, start + sizes[shard]


def load_weights(model: CausalLM, folder: str | Path) -> None:
    """Copy every tensor of the checkpoint into the model; missing or unexpected names raise."""
    folder = Path(folder)
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    # A progress bar (terminal or notebook) on rank 0: loading is the longest wait of a start.
    files = safetensors_files(folder)
    total = 0
    for path in files:  # headers only: cheap
        with safe_open(str(path), framework="pt") as f:
            total += len(f.keys())
    bar = progress(total, "Loading weights", "tensor",
                   disable=model.tp.rank != 0 or os.environ.get("KVSCOPE_QUIET") == "1")
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                bar.update(1)
                target = name.removeprefix("model.")
                if target == "lm_head.weight" and model.lm_head is None:
                    continue  # tied: the embedding serves as the LM head
                tp = model.tp
                tensor = f.get_tensor(name) if tp.size == 1 else _read_shard(f, name, tp.rank, tp.size)
                for frag, (packed, shard) in PACKED_MODULES.items():
                    if f".{frag}." in target:
                        target = target.replace(frag, packed)
                        lo, hi = _shard_range(model, packed, shard)
                        _copy(params, target, tensor, name, rows=(lo, hi))
                        break
                else:
                    _copy(params, target, tensor, name)
                loaded.add(target)
    bar.close()
    missing = [n for n in params if n not in loaded]
    if missing:
        raise ValueError(f"checkpoint in {folder} lacks weights: {missing[:5]}{' ...' if len(missing) > 5 else ''}")


def _read_shard(f, name: str, rank: int, size: int) -> torch.Tensor:
    """This rank's slice of checkpoint tensor `name` (all of it when it is replicated)."""
    dim = split_dim(name)
    if dim is None:
        return f.get_tensor(name)
    view = f.get_slice(name)
    lo, hi = shard_bounds(view.get_shape()[dim], rank, size)
    return view[lo:hi] if dim == 0 else view[:, lo:hi]


def _copy(params: dict[str, torch.nn.Parameter], target: str, tensor: torch.Tensor, source: str,
          rows: tuple[int, int] | None = None) -> None:
    if target not in params:
        raise ValueError(f"unexpected weight {source!r} in checkpoint (no parameter {target!r})")
    dest = params[target].data if rows is None else params[target].data[rows[0]:rows[1]]
    if dest.shape != tensor.shape:
        raise ValueError(f"weight {source!r} has shape {tuple(tensor.shape)}, expected {tuple(dest.shape)}")
    dest.copy_(tensor.to(dest.dtype))
