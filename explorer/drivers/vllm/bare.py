"""vLLM 0.32's own v1 Scheduler, KVCacheManager and BlockPool, built the way EngineCore builds
them but without weights or workers (as vLLM's tests/v1/core/utils.py does). The scheduler
oracle steps it against kvscope's; the recorder's scale benchmark steps it with and without
kvscope's recorder. The caller feeds it ModelRunnerOutputs with the tokens it wants sampled."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from engine.core.kv_cache_groups import parse_group_kinds

from .config import set_in_process_env

set_in_process_env("VLLM_ENABLE_V1_MULTIPROCESSING", "0", keep_existing=True)

_MODEL_DIR: Path | None = None


def _model_dir() -> Path:
    """ModelConfig reads a model's config.json (never its weights): a tiny Llama config."""
    global _MODEL_DIR
    if _MODEL_DIR is None:
        _MODEL_DIR = Path(tempfile.mkdtemp(prefix="kvscope-bare-vllm-"))
        (_MODEL_DIR / "config.json").write_text(json.dumps({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1024,
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 8192, "torch_dtype": "float32"}))
    return _MODEL_DIR


def bare_scheduler(*, block_size: int, num_blocks: int, max_model_len: int, max_num_batched_tokens: int,
                   max_num_seqs: int, enable_chunked_prefill: bool = True, enable_prefix_caching: bool = True,
                   scheduler_reserve_full_isl: bool = True, long_prefill_token_threshold: int = 0,
                   long_prefill_token_threshold_adaptive: bool = False, policy: str = "fcfs",
                   watermark: float = 0.0, prefix_caching_hash_algo: str = "sha256",
                   scheduler_cls: type | None = None, async_scheduling: bool = False,
                   sliding_window: int | None = None, prefix_cache_retention_interval: int | None = 0,
                   kv_cache_groups: str | None = None) -> Any:
    """A vLLM Scheduler, or its AsyncScheduler with `async_scheduling` as vLLM's engine core
    picks (or `scheduler_cls`, a subclass of either), over a pool of `num_blocks`
    blocks (the null block included). `long_prefill_token_threshold` (0: off) and its adaptive
    floor, `policy` ('fcfs' | 'priority'), `watermark` and `prefix_caching_hash_algo` are
    vLLM's own settings of those names; vLLM validates each. `async_scheduling`: the config
    says so, as a GPU server's does (vLLM's CPU platform turns it off, so it is set after the
    config is built); the caller then schedules step N+1 before updating step N, as vLLM's
    engine core does. `sliding_window` (tokens): a second KV cache group of sliding-window
    layers beside the full-attention one (as Gemma 3 or gpt-oss have), each group its own block
    table over the one pool; `prefix_cache_retention_interval` is then vLLM's setting of that
    name (which sliding-window or Mamba blocks it caches; 0 by default, as vLLM's CacheConfig).
    `kv_cache_groups`: the groups' kinds in the order vLLM allocates them, as a recorded vLLM
    model had them ("sliding,sliding,sliding,full" for a 4-layer Gemma 3, "full,mamba" for a
    hybrid Mamba model: engine.core.kv_cache_groups.RECORDED_GROUP_KINDS; "sliding" needs
    `sliding_window`); None: the full-attention group, then one sliding-window group where
    `sliding_window` is given. A Mamba group is cached in "align" mode, as vLLM's engine core
    sets a hybrid model with prefix caching: its state is one float that nothing reads (the
    scheduler sees only the spec)."""
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
        SlidingWindowSpec,
    )
    from vllm.v1.structured_output import StructuredOutputManager

    model = ModelConfig(model=str(_model_dir()), dtype="float32", skip_tokenizer_init=True,
                        max_model_len=max_model_len)
    sched = SchedulerConfig(max_model_len=max_model_len, is_encoder_decoder=False,
                            max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                            enable_chunked_prefill=enable_chunked_prefill, async_scheduling=False,
                            scheduler_reserve_full_isl=scheduler_reserve_full_isl,
                            long_prefill_token_threshold=long_prefill_token_threshold,
                            long_prefill_token_threshold_adaptive=long_prefill_token_threshold_adaptive,
                            policy=policy, watermark=watermark)
    cache = CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching,
                        prefix_caching_hash_algo=prefix_caching_hash_algo)
    cache.num_gpu_blocks = num_blocks
    vllm_config = VllmConfig(model_config=model, scheduler_config=sched, cache_config=cache)
    vllm_config.scheduler_config.async_scheduling = async_scheduling
    kinds = (parse_group_kinds(kv_cache_groups) if kv_cache_groups else
             ["full", "sliding"] if sliding_window is not None else ["full"])
    if "sliding" in kinds and sliding_window is None:
        raise ValueError(f"kv_cache_groups {kv_cache_groups!r} has a sliding-window group: sliding_window must be set")
    if "mamba" in kinds:
        vllm_config.cache_config.mamba_cache_mode = "align"

    def spec(kind: str) -> Any:
        if kind == "mamba":
            return MambaSpec(block_size=block_size, shapes=((1,),), dtypes=(torch.float32,), mamba_cache_mode="align")
        if kind == "sliding":
            return SlidingWindowSpec(block_size, num_kv_heads=1, head_size=1, dtype=torch.float32,
                                     sliding_window=sliding_window)
        return FullAttentionSpec(block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)

    groups = [KVCacheGroupSpec([f"layer{i}"], spec(kind)) for i, kind in enumerate(kinds)]
    extra: dict[str, Any] = {}
    if len(kinds) > 1:
        extra["prefix_cache_retention_interval"] = prefix_cache_retention_interval
    kv_config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups, **extra)
    if scheduler_cls is None:
        scheduler_cls = AsyncScheduler if async_scheduling else Scheduler
    return scheduler_cls(vllm_config=vllm_config, kv_cache_config=kv_config, block_size=block_size,
                         structured_output_manager=StructuredOutputManager(vllm_config), log_stats=True)


_HASHERS: dict[tuple[int, str], Any] = {}
_NONE_HASH_OF: list[str] = []  # the algorithm vLLM's process-wide NONE_HASH was last made with


def bare_request(request_id: str, prompt: list[int], params: Any, block_size: int, *, hash_algo: str = "sha256",
                 arrival_time: float | None = None, priority: int = 0, cache_salt: str | None = None,
                 lora_name: str | None = None) -> Any:
    """A vLLM Request with the block hasher its engine would give it (`hash_algo`: vLLM's
    `prefix_caching_hash_algo`, sha256 by default as in vLLM's CacheConfig), for
    `bare_scheduler(...).add_request`. `arrival_time` and `priority` order the waiting queue
    under the 'priority' policy (vLLM stamps time.time() when none is given). `cache_salt` and
    `lora_name` put its blocks in that hash domain, as vLLM's block hasher does (the adapter is
    never loaded: a scheduler without a LoRA config hashes with it and limits nothing)."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    key = (block_size, hash_algo)
    if key not in _HASHERS:
        _HASHERS[key] = get_request_block_hasher(block_size, get_hash_fn_by_name(hash_algo))
    if _NONE_HASH_OF[-1:] != [hash_algo]:  # the chain's root is a process-wide value in vLLM
        init_none_hash(get_hash_fn_by_name(hash_algo))
        _NONE_HASH_OF[:] = [hash_algo]
    lora = None
    if lora_name is not None:
        from vllm.lora.request import LoRARequest

        lora = LoRARequest(lora_name, _lora_id(lora_name), lora_path=lora_name)
    return Request(request_id, list(prompt), params, None, arrival_time=arrival_time, priority=priority,
                   block_hasher=_HASHERS[key], cache_salt=cache_salt, lora_request=lora)


_LORA_IDS: dict[str, int] = {}


def _lora_id(name: str) -> int:
    """vLLM's LoRA ids start at 1; one per adapter name."""
    return _LORA_IDS.setdefault(name, len(_LORA_IDS) + 1)


def sampled_output(scheduler: Any, out: Any, token_of: Any) -> Any:
    """The ModelRunnerOutput for `out` (a SchedulerOutput): `token_of(request_id, index)` for each
    request whose known tokens are all computed after this step (a prefill chunk samples none)."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(out.num_scheduled_tokens)
    sampled = {}
    for rid in ids:
        req = scheduler.requests.get(rid)
        # None: it finished since this step was scheduled (async scheduling: the step before it
        # ended it), and vLLM's update skips it. Else schedule() already advanced num_computed_tokens.
        if req is not None and req.num_computed_tokens >= req.num_tokens:
            sampled[rid] = token_of(rid, len(req.output_token_ids))
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                             sampled_token_ids=[[sampled[r]] if r in sampled else [] for r in ids]), sampled
