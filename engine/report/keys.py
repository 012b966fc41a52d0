"""The keys of the record and snapshot shapes (engine/report/schema.py) as constants, one
class per shape: `SCHED.NUM_TOKENS == "num_tokens"`, and `ALL`, every key in the shape's order.

They are written out, not derived from the shapes, because a type checker reads a `Final`
string constant as its literal value: `record[REC.STEP]` is then an `int` for mypy, and a key
the shape lacks (`{SCHED.NUM_TOKENZ: 3}`, or a constant spelling a key that is gone) is an
error before anything runs. schema.py checks at import that each class lists exactly its
shape's keys, in order, so the two cannot drift apart.
"""
from __future__ import annotations

from typing import Any, ClassVar, Final


class Keys:
    """A shape's keys: each constant is the key's name in capitals; `ALL` is filled in from them."""

    ALL: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        keys = {name: value for name, value in vars(cls).items() if name.isupper()}
        wrong = [f"{name} = {value!r}" for name, value in keys.items() if value != name.lower()]
        if wrong:
            raise TypeError(f"{cls.__name__}: each constant is its key in capitals, not {wrong}")
        cls.ALL = tuple(keys.values())


class REC(Keys):
    """StepRecordDict's keys."""

    STEP: Final = "step"
    SCHEDULED: Final = "scheduled"
    BATCH: Final = "batch"
    SAMPLED: Final = "sampled"
    PREEMPTED: Final = "preempted"
    FINISHED: Final = "finished"
    NEW_REQUESTS: Final = "new_requests"
    BLOCKS: Final = "blocks"
    NUM_FREE_BLOCKS: Final = "num_free_blocks"
    TIMINGS_MS: Final = "timings_ms"
    ENGINE_TIME_S: Final = "engine_time_s"
    WALL_TIME_S: Final = "wall_time_s"
    TOKEN_BUDGET: Final = "token_budget"
    NUM_RUNNING: Final = "num_running"
    NUM_WAITING: Final = "num_waiting"
    BUDGETS: Final = "budgets"
    BATCH_SOURCE: Final = "batch_source"
    SCHEDULED_AHEAD: Final = "scheduled_ahead"
    CHANGES: Final = "changes"


class AHEAD(Keys):
    """ScheduledAheadDict's keys."""

    IN_FLIGHT_STEP: Final = "in_flight_step"
    PLACEHOLDERS: Final = "placeholders"


class SCHED(Keys):
    """ScheduledDict's keys."""

    REQUEST_ID: Final = "request_id"
    NUM_TOKENS: Final = "num_tokens"
    NUM_COMPUTED_BEFORE: Final = "num_computed_before"
    IS_PREFILL: Final = "is_prefill"
    NUM_CACHED_TOKENS: Final = "num_cached_tokens"
    CHUNK_INDEX: Final = "chunk_index"


class BATCH(Keys):
    """BatchDict's keys."""

    INPUT_IDS: Final = "input_ids"
    POSITIONS: Final = "positions"
    QUERY_START_LOC: Final = "query_start_loc"
    SEQ_LENS: Final = "seq_lens"
    SLOT_MAPPING: Final = "slot_mapping"
    BLOCK_TABLES: Final = "block_tables"
    LOGITS_INDICES: Final = "logits_indices"
    GROUP_SLOT_MAPPINGS: Final = "group_slot_mappings"
    GROUP_BLOCK_TABLES: Final = "group_block_tables"


class SAMPLE(Keys):
    """SampledDict's keys."""

    TOKEN_ID: Final = "token_id"
    TEXT: Final = "text"
    TOP: Final = "top"


class EV(Keys):
    """BlockEventsDict's keys."""

    ALLOCATED: Final = "allocated"
    FREED: Final = "freed"
    CACHED: Final = "cached"
    HITS: Final = "hits"
    EVICTED: Final = "evicted"
    SAME_STEP_HITS: Final = "same_step_hits"


class TIME(Keys):
    """TimingsDict's keys."""

    SCHEDULE: Final = "schedule"
    PREPARE: Final = "prepare"
    FORWARD: Final = "forward"
    SAMPLE: Final = "sample"
    UPDATE: Final = "update"
    TOTAL: Final = "total"
    COLLECTIVES: Final = "collectives"
    EXPLORER_RECORD: Final = "explorer_record"
    BACKEND: Final = "backend"
    CUDA_GRAPH_BUCKET: Final = "cuda_graph_bucket"
    FORWARD_PATH: Final = "forward_path"


class BUDGET(Keys):
    """BudgetsDict's keys."""

    MAX_NUM_BATCHED_TOKENS: Final = "max_num_batched_tokens"
    MAX_NUM_SEQS: Final = "max_num_seqs"
    ENABLE_CHUNKED_PREFILL: Final = "enable_chunked_prefill"
    ENABLE_PREFIX_CACHING: Final = "enable_prefix_caching"
    SCHEDULER_RESERVE_FULL_ISL: Final = "scheduler_reserve_full_isl"
    SCHEDULING_POLICY: Final = "scheduling_policy"


class SNAP(Keys):
    """EngineSnapshotDict's keys."""

    STEP: Final = "step"
    CONFIG: Final = "config"
    MODEL_INFO: Final = "model_info"
    METRICS: Final = "metrics"
    QUEUES: Final = "queues"
    BLOCK_POOL: Final = "block_pool"


class QUEUE(Keys):
    """QueuesDict's keys."""

    WAITING: Final = "waiting"
    RUNNING: Final = "running"
    FINISHED: Final = "finished"


class REQ(Keys):
    """RequestDict's keys."""

    REQUEST_ID: Final = "request_id"
    STATUS: Final = "status"
    PROMPT_TOKEN_IDS: Final = "prompt_token_ids"
    OUTPUT_TOKEN_IDS: Final = "output_token_ids"
    PROMPT_TEXT: Final = "prompt_text"
    OUTPUT_TEXT: Final = "output_text"
    NUM_COMPUTED_TOKENS: Final = "num_computed_tokens"
    NUM_CACHED_TOKENS: Final = "num_cached_tokens"
    BLOCK_TABLE: Final = "block_table"
    NUM_PREEMPTIONS: Final = "num_preemptions"
    FINISH_REASON: Final = "finish_reason"
    MAX_TOKENS: Final = "max_tokens"
    SAMPLING_PARAMS: Final = "sampling_params"
    PRIORITY: Final = "priority"
    METRICS: Final = "metrics"
    NUM_PROMPT_TOKENS: Final = "num_prompt_tokens"
    NUM_OUTPUT_TOKENS: Final = "num_output_tokens"
    CACHE_SALT: Final = "cache_salt"
    LORA_NAME: Final = "lora_name"
    GROUP_BLOCK_TABLES: Final = "group_block_tables"
    GROUP_HIT_TOKENS: Final = "group_hit_tokens"


class RMETRICS(Keys):
    """RequestMetricsDict's keys."""

    ENGINE: Final = "engine"
    WALL: Final = "wall"


class CLOCK(Keys):
    """ClockDict's keys."""

    ARRIVAL_TIME: Final = "arrival_time"
    FIRST_SCHEDULED_TIME: Final = "first_scheduled_time"
    FIRST_TOKEN_TIME: Final = "first_token_time"
    TOKEN_TIMES: Final = "token_times"
    PREEMPTED_TIMES: Final = "preempted_times"
    FINISHED_TIME: Final = "finished_time"
    TIME_TO_FIRST_TOKEN: Final = "time_to_first_token"
    INTER_TOKEN_LATENCY: Final = "inter_token_latency"
    TIME_PER_OUTPUT_TOKEN: Final = "time_per_output_token"
    E2E_REQUEST_LATENCY: Final = "e2e_request_latency"
    REQUEST_QUEUE_TIME: Final = "request_queue_time"


class POOL(Keys):
    """BlockPoolDict's keys."""

    NUM_BLOCKS: Final = "num_blocks"
    BLOCK_SIZE: Final = "block_size"
    NUM_FREE_BLOCKS: Final = "num_free_blocks"
    BLOCKS: Final = "blocks"


class BLOCK(Keys):
    """BlockDict's keys."""

    BLOCK_ID: Final = "block_id"
    REF_COUNT: Final = "ref_count"
    HASH: Final = "hash"
    TOKEN_IDS: Final = "token_ids"
    OWNERS: Final = "owners"
    IS_NULL: Final = "is_null"
    IS_FREE: Final = "is_free"


class METRICS(Keys):
    """EngineMetricsDict's keys."""

    NUM_STEPS: Final = "num_steps"
    ENGINE_TIME_S: Final = "engine_time_s"
    KV_CACHE_USAGE: Final = "kv_cache_usage"
    PREFIX_CACHE_HITS: Final = "prefix_cache_hits"
    PREFIX_CACHE_QUERIES: Final = "prefix_cache_queries"
    NUM_PREEMPTIONS: Final = "num_preemptions"
    NUM_GENERATED_TOKENS: Final = "num_generated_tokens"
    NUM_PROMPT_TOKENS_COMPUTED: Final = "num_prompt_tokens_computed"


class INFO(Keys):
    """ModelInfoDict's keys."""

    ENGINE: Final = "engine"
    ENGINE_VERSION: Final = "engine_version"
    NAME: Final = "name"
    ARCHITECTURE: Final = "architecture"
    NUM_LAYERS: Final = "num_layers"
    NUM_HEADS: Final = "num_heads"
    NUM_KV_HEADS: Final = "num_kv_heads"
    HEAD_DIM: Final = "head_dim"
    HIDDEN_SIZE: Final = "hidden_size"
    VOCAB_SIZE: Final = "vocab_size"
    DTYPE: Final = "dtype"
    COMPUTE_DTYPE: Final = "compute_dtype"
    DEVICE: Final = "device"
    MAX_MODEL_LEN: Final = "max_model_len"
    ATTENTION_BACKEND: Final = "attention_backend"
    CUDA_GRAPHS: Final = "cuda_graphs"
    CUDA_GRAPHS_OFF: Final = "cuda_graphs_off"
    NATIVE_DECODE: Final = "native_decode"
    NATIVE_DECODE_OFF: Final = "native_decode_off"
    NATIVE_LINEAR_ROWS: Final = "native_linear_rows"
    NATIVE_ROWS_SOURCE: Final = "native_rows_source"
    CPU_GEMM_DTYPE: Final = "cpu_gemm_dtype"
    KV_BYTES_PER_BLOCK: Final = "kv_bytes_per_block"
    INTERMEDIATE_SIZE: Final = "intermediate_size"
    TIE_WORD_EMBEDDINGS: Final = "tie_word_embeddings"
    TENSOR_PARALLEL_SIZE: Final = "tensor_parallel_size"
    PIPELINE_PARALLEL_SIZE: Final = "pipeline_parallel_size"
    DATA_PARALLEL_SIZE: Final = "data_parallel_size"
    DATA_PARALLEL_RANK: Final = "data_parallel_rank"
    ASYNC_SCHEDULING: Final = "async_scheduling"
    MODEL_PATH: Final = "model_path"
    TP_BACKEND: Final = "tp_backend"
    NUM_HEADS_PER_RANK: Final = "num_heads_per_rank"
    NUM_KV_HEADS_PER_RANK: Final = "num_kv_heads_per_rank"
    KV_BYTES_PER_BLOCK_PER_RANK: Final = "kv_bytes_per_block_per_rank"
    KV_BYTES_PER_RANK: Final = "kv_bytes_per_rank"
    TENSOR_PARALLEL: Final = "tensor_parallel"
    LIVE: Final = "live"
    KV_CACHE_GROUPS: Final = "kv_cache_groups"


class CHANGES(Keys):
    """ChangesDict's keys."""

    STEP: Final = "step"
    REQUESTS: Final = "requests"
    QUEUES: Final = "queues"
    FINISHED: Final = "finished"
    BLOCKS: Final = "blocks"
    NUM_FREE_BLOCKS: Final = "num_free_blocks"
    METRICS: Final = "metrics"
    CONFIG: Final = "config"
    MODEL_INFO: Final = "model_info"
    SNAPSHOT: Final = "snapshot"
    RESTART: Final = "restart"
    DECODES: Final = "decodes"


class DECODES(Keys):
    """DecodesDict's keys."""

    REQUEST_IDS: Final = "request_ids"
    NUM_COMPUTED_TOKENS: Final = "num_computed_tokens"
    OUTPUT_TOKENS: Final = "output_tokens"
    OUTPUT_TEXTS: Final = "output_texts"
    ENGINE_TOKEN_TIMES: Final = "engine_token_times"
    WALL_TOKEN_TIMES: Final = "wall_token_times"


class RCHANGE(Keys):
    """RequestChangeDict's keys."""

    REQUEST_ID: Final = "request_id"
    STATUS: Final = "status"
    NUM_COMPUTED_TOKENS: Final = "num_computed_tokens"
    NUM_CACHED_TOKENS: Final = "num_cached_tokens"
    NUM_PREEMPTIONS: Final = "num_preemptions"
    FINISH_REASON: Final = "finish_reason"
    OUTPUT_TEXT: Final = "output_text"
    PROMPT_TOKEN_IDS: Final = "prompt_token_ids"
    PROMPT_TEXT: Final = "prompt_text"
    MAX_TOKENS: Final = "max_tokens"
    SAMPLING_PARAMS: Final = "sampling_params"
    PRIORITY: Final = "priority"
    CACHE_SALT: Final = "cache_salt"
    LORA_NAME: Final = "lora_name"
    NUM_PROMPT_TOKENS: Final = "num_prompt_tokens"
    NUM_OUTPUT_TOKENS: Final = "num_output_tokens"
    GROUP_BLOCK_TABLES: Final = "group_block_tables"
    GROUP_HIT_TOKENS: Final = "group_hit_tokens"
    OUTPUT_FROM: Final = "output_from"
    OUTPUT_TAIL: Final = "output_tail"
    TABLE_FROM: Final = "table_from"
    TABLE_TAIL: Final = "table_tail"
    CLOCKS: Final = "clocks"


class CCHANGE(Keys):
    """ClockChangeDict's keys."""

    ARRIVAL_TIME: Final = "arrival_time"
    FIRST_SCHEDULED_TIME: Final = "first_scheduled_time"
    FIRST_TOKEN_TIME: Final = "first_token_time"
    FINISHED_TIME: Final = "finished_time"
    PREEMPTED_TIMES: Final = "preempted_times"
    TOKEN_TIMES_FROM: Final = "token_times_from"
    TOKEN_TIMES_TAIL: Final = "token_times_tail"
