"""LLM: the offline entry point. generate() turns prompts into many engine steps."""
from __future__ import annotations

from dataclasses import dataclass

from .config import EngineConfig
from .llm_engine import LLMEngine
from .request import RequestMetrics
from .sampling_params import SamplingParams


@dataclass
class RequestOutput:
    """A finished request as `LLM.generate` returns it (vLLM's RequestOutput, one completion)."""
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    metrics: RequestMetrics


class LLM:
    """`LLM(model=None, **config_fields)`; model=None loads the default SmolLM2-135M-Instruct."""

    def __init__(self, model: str | None = None, *, share_model_with: LLM | None = None, **config_fields) -> None:
        """`share_model_with`: reuse that LLM's loaded weights and tokenizer when compatible."""
        self.engine: LLMEngine = LLMEngine(EngineConfig(model=None if model is None else str(model), **config_fields),
                                share_model_with=share_model_with.engine if share_model_with else None)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Run prompts (str or token-id lists) to completion; outputs in prompt order."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"sampling_params has {len(params)} entries for {len(prompts)} prompts")
        eng = self.engine
        ids = []
        try:
            for p, sp in zip(prompts, params):
                ids.append(eng.add_request(p, sp))
        except ValueError:
            for rid in ids:  # leave the engine as it was
                eng.abort_request(rid)
            raise
        pending = set(ids)
        bar = _progress(len(ids), use_tqdm)
        while pending:
            rec = eng.step()
            done = pending.intersection(rec.finished)
            pending -= done
            if bar is not None:
                bar.update(len(done))
                if rec.engine_time_s > 0:
                    bar.set_postfix(tok_s=f"{eng.num_generated_tokens / rec.engine_time_s:.1f}", refresh=False)
        if bar is not None:
            bar.close()
        outs = []
        for rid in ids:
            req = eng.requests[rid]
            outs.append(RequestOutput(rid, req.prompt_text, list(req.prompt_token_ids), list(req.output_token_ids),
                                      eng.tokenizer.decode(req.output_token_ids, skip_special_tokens=True),
                                      req.finish_reason, req.metrics))
        return outs

    def shutdown(self) -> None:
        """Release the engine: tensor-parallel workers, when any, stop here (idempotent; they
        also stop when the LLM is garbage-collected or the interpreter exits)."""
        self.engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def _progress(total: int, enabled: bool):
    if not enabled or total < 2:
        return None
    from tqdm.auto import tqdm
    return tqdm(total=total, desc="Processed prompts", unit="req", dynamic_ncols=True)
