"""vLLM 0.32's own v1 Scheduler + KVCacheManager + BlockPool, built the way EngineCore builds
them but without weights or workers (as vLLM's tests/v1/core/utils.py does), and stepped with
ModelRunnerOutputs that carry the workload's tokens."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch  # noqa: E402
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from .workloads import OracleRequest, Workload  # noqa: E402

_HASH = get_hash_fn_by_name("sha256")
init_none_hash(_HASH)
_MODEL_DIR: Path | None = None


def _model_dir() -> Path:
    """ModelConfig reads a model's config.json (never its weights): a tiny Llama config."""
    global _MODEL_DIR
    if _MODEL_DIR is None:
        _MODEL_DIR = Path(tempfile.mkdtemp(prefix="kvscope-oracle-"))
        (_MODEL_DIR / "config.json").write_text(json.dumps({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1024,
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 8192, "torch_dtype": "float32"}))
    return _MODEL_DIR


class VllmScheduler:
    name = "vllm"

    def __init__(self, w: Workload) -> None:
        self.w = w
        model = ModelConfig(model=str(_model_dir()), dtype="float32", skip_tokenizer_init=True,
                            max_model_len=w.max_model_len)
        sched = SchedulerConfig(max_model_len=w.max_model_len, is_encoder_decoder=False,
                                max_num_batched_tokens=w.max_num_batched_tokens, max_num_seqs=w.max_num_seqs,
                                enable_chunked_prefill=w.enable_chunked_prefill, async_scheduling=False,
                                scheduler_reserve_full_isl=w.scheduler_reserve_full_isl)
        cache = CacheConfig(block_size=w.block_size, enable_prefix_caching=w.enable_prefix_caching)
        cache.num_gpu_blocks = w.num_blocks
        vllm_config = VllmConfig(model_config=model, scheduler_config=sched, cache_config=cache)
        spec = FullAttentionSpec(w.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
        kv_config = KVCacheConfig(num_blocks=w.num_blocks, kv_cache_tensors=[],
                                  kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
        self.scheduler = Scheduler(vllm_config=vllm_config, kv_cache_config=kv_config, block_size=w.block_size,
                                   structured_output_manager=StructuredOutputManager(vllm_config), log_stats=True)
        self.block_pool = self.scheduler.kv_cache_manager.block_pool
        self.hasher = get_request_block_hasher(w.block_size, _HASH)

    def add(self, r: OracleRequest) -> None:
        params = SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True)
        self.scheduler.add_request(Request(r.request_id, list(r.prompt), params, None, block_hasher=self.hasher))

    def step(self) -> dict:
        sch = self.scheduler
        out = sch.schedule()
        new = {d.req_id: d.num_computed_tokens for d in out.scheduled_new_reqs}
        cached = out.scheduled_cached_reqs
        before = new | dict(zip(cached.req_ids, cached.num_computed_tokens))
        ids = list(out.num_scheduled_tokens)
        sampled = {}
        for rid in ids:
            req = sch.requests[rid]
            # schedule() already advanced num_computed_tokens: a request whose known tokens are
            # all computed in this step is sampled, a prefill chunk is not.
            if req.num_computed_tokens >= req.num_tokens:
                sampled[rid] = self.w.sampled_token(rid, len(req.output_token_ids))
        runner_out = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                       sampled_token_ids=[[sampled[r]] if r in sampled else [] for r in ids])
        outputs = sch.update_from_output(out, runner_out)
        finished = [o.request_id for eco in outputs.values() for o in eco.outputs if o.finish_reason is not None]
        return {"scheduled": dict(out.num_scheduled_tokens), "computed_before": {r: before[r] for r in ids},
                "preempted": sorted(out.preempted_req_ids or ()), "finished": sorted(finished), "sampled": sampled}

    def state(self) -> dict:
        sch, kv = self.scheduler, self.scheduler.kv_cache_manager
        return {"waiting": [r.request_id for r in sch.waiting], "running": [r.request_id for r in sch.running],
                "block_tables": {r.request_id: list(kv.get_block_ids(r.request_id)[0]) for r in sch.running},
                "num_computed_tokens": {r.request_id: r.num_computed_tokens for r in sch.running},
                "free_queue": [b.block_id for b in self.block_pool.free_block_queue.get_all_free_blocks()],
                "cached_blocks": [b.block_id for b in self.block_pool.blocks if b.block_hash is not None]}
