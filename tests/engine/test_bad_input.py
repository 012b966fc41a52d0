"""Bad input: each error names the field and the limit, and the engine keeps serving."""
import pytest

from engine import LLM, EngineConfig, SamplingParams

from .helpers import greedy


@pytest.fixture(scope="module")
def llm(tiny_qwen3_path):
    return LLM(model=str(tiny_qwen3_path), block_size=16, num_kv_blocks=9, max_model_len=256,
               enable_chunked_prefill=False, max_num_batched_tokens=64)


BAD_REQUESTS = [
    ("", {}, "prompt"),
    ([], {}, "prompt"),
    (list(range(300)), {}, "max_model_len"),
    ([5, 151_936 + 10], {}, "vocabulary"),
    ([-1], {}, "vocabulary"),
    (list(range(100)), {}, "max_num_batched_tokens"),
    (list(range(60)), {"max_tokens": 100}, "num_kv_blocks"),
]


@pytest.mark.parametrize("prompt,params,field", BAD_REQUESTS)
def test_bad_request_is_rejected_with_the_field_name(llm, prompt, params, field):
    with pytest.raises(ValueError, match=field):
        llm.engine.add_request(prompt, greedy(params.get("max_tokens", 4)))
    # The engine still serves a good request afterwards.
    out = llm.generate([[1, 2, 3]], greedy(2, ignore_eos=True), use_tqdm=False)
    assert len(out[0].token_ids) == 2


BAD_SAMPLING = [
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": -0.5}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"seed": -3}, "seed"),
]


@pytest.mark.parametrize("kwargs,field", BAD_SAMPLING)
def test_bad_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


BAD_CONFIG = [
    ({"attention_backend": "magic"}, "attention_backend"),
    ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"block_size": 0}, "block_size"),
    ({"num_kv_blocks": 1}, "num_kv_blocks"),
    ({"scheduling_policy": "fifo"}, "scheduling_policy"),
    ({"dtype": "int8"}, "dtype"),
    ({"device": "tpu"}, "device"),
    ({"attention_backend": "flash_attn", "block_size": 16}, "block_size"),   # flash-attn pages are multiples of 256
    ({"attention_backend": "flash_attn", "block_size": 256, "dtype": "float32"}, "dtype"),  # fp16/bf16 only
    ({"scheduler_reserve_full_isl": 1}, "scheduler_reserve_full_isl"),
]


@pytest.mark.parametrize("kwargs,field", BAD_CONFIG)
def test_bad_config_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        EngineConfig(**kwargs)


def test_unknown_request_id_on_abort(llm):
    with pytest.raises(ValueError, match="request_id"):
        llm.engine.abort_request("nope")


def test_duplicate_request_id(llm):
    eng = llm.engine
    eng.add_request([1, 2], greedy(1), request_id="dup")
    with pytest.raises(ValueError, match="request_id"):
        eng.add_request([1, 2], greedy(1), request_id="dup")
    eng.abort_request("dup")


def test_live_budget_change_is_validated(llm):
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        llm.engine.update_scheduler_config(max_num_batched_tokens=0)
    with pytest.raises(ValueError, match="block_size"):
        llm.engine.update_scheduler_config(block_size=32)
    assert llm.engine.config.max_num_batched_tokens == 64


def test_missing_model_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"config\.json"):
        LLM(model=str(tmp_path))
