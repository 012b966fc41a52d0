"""Picks each sampled request's next token and reports the candidates it chose from."""
from __future__ import annotations

from collections.abc import Callable

import torch

from ..cpu_kernels import native
from ..request import Request
from .batch import SampleResult


def filtered_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The distribution sampling draws from, for one row of fp32 logits."""
    logits = logits / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the top token always stays).
        drop = sorted_p.cumsum(-1) - sorted_p >= top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
        probs = probs / probs.sum()
    return probs


class Sampler:
    """Greedy rows are one batched argmax; random rows draw with the request's own generator
    (seeded requests) or the engine's, so a seed fixes the tokens whatever shares the batch.
    On a CPU with kvscope's native kernels, the argmax and the greedy rows' candidates are one
    pass over each row (kv_greedy_top) instead of torch's argmax, topk and logsumexp."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        self.native = native()

    def __call__(self, logits: torch.Tensor, requests: list[Request], with_top: bool = True) -> list[SampleResult]:
        return self.launch(logits, requests, with_top)()

    def launch(self, logits: torch.Tensor, requests: list[Request],
               with_top: bool = True) -> Callable[[], list[SampleResult]]:
        """Start sampling the rows; the call returned gives the results. On a GPU the greedy
        rows' tokens and candidates stay on the device until then, so a caller that asks when
        the step lands (async scheduling) does not wait for the forward here."""
        if not requests:
            return list
        # Candidates of greedy rows, batched (no per-row kernel calls), on the logits' device.
        rows = [i for i, r in enumerate(requests) if r.params.greedy and with_top and r.params.logprobs_top]
        k = min(max((requests[i].params.logprobs_top for i in rows), default=1), logits.shape[-1])
        greedy = self._greedy(logits, rows, k)
        drawn = self._drawn_rows(logits, requests)

        def results() -> list[SampleResult]:
            greedy_tokens, top_ids, top_probs = greedy()
            greedy_top: dict[int, list[tuple[int, float]]] = {}
            for j, i in enumerate(rows):
                n = requests[i].params.logprobs_top
                greedy_top[i] = list(zip(top_ids[j][:n], top_probs[j][:n]))
            out: list[SampleResult] = []
            for row, req in enumerate(requests):
                p = req.params
                if p.greedy:
                    out.append(SampleResult(greedy_tokens[row], greedy_top.get(row, [])))
                    continue
                probs = filtered_probs(drawn[row], p.temperature, p.top_k, p.top_p)
                gen = req.generator if req.generator is not None else self.generator
                token = int(torch.multinomial(probs, 1, generator=gen).item())
                top = []
                if with_top and p.logprobs_top:
                    vals, ids = probs.topk(min(p.logprobs_top, probs.shape[-1]))
                    top = list(zip(ids.tolist(), vals.tolist()))
                out.append(SampleResult(token, top))
            return out
        return results

    @staticmethod
    def _drawn_rows(logits: torch.Tensor, requests: list[Request]) -> dict[int, torch.Tensor]:
        """The fp32 host logits of each row drawn at random. Their generators live on the host,
        so a seed gives the same token on any device; from a GPU only these rows are copied (all
        of a 256-row batch's logits are 155 MB)."""
        drawn = [i for i, r in enumerate(requests) if not r.params.greedy]
        if not drawn:
            return {}
        if logits.device.type == "cpu":
            host = logits if logits.dtype == torch.float32 else logits.float()
            return {i: host[i] for i in drawn}
        return dict(zip(drawn, logits[drawn].float().cpu()))

    def _greedy(self, logits: torch.Tensor, rows: list[int],
                k: int) -> Callable[[], tuple[list[int], list[list[int]], list[list[float]]]]:
        """A call giving every row's argmax token, and for the rows listed the ids of their k
        best logits and those candidates' probabilities (lists: item j of each is rows[j]'s)."""
        if self.native is not None and logits.device.type == "cpu":
            # One pass over each row. A torch call costs ~10-50 us right after a decode step's
            # weights streamed through the caches (one stream's step is ~15 ms on a 2-core CPU).
            logits = logits if logits.dtype == torch.float32 else logits.float()
            ids, probs = self.native.greedy_top(logits if logits.is_contiguous() else logits.contiguous(), k)
            tokens = [row[0] for row in ids]
            if len(rows) != len(ids):
                ids, probs = [ids[i] for i in rows], [probs[i] for i in rows]
            return lambda: (tokens, ids, probs)
        # Elsewhere torch's, on the logits' device (a GPU's: only tokens and candidates cross to
        # the host, when the call is made).
        logits = logits.float()
        best = logits.argmax(-1)
        if not rows:
            return lambda: (best.tolist(), [], [])
        picked = logits if len(rows) == logits.shape[0] else logits[rows]
        # The k best logits and their probabilities exp(logit - logsumexp): the same as softmax
        # then topk, without writing a probability for every vocabulary entry.
        top_logits, top_ids = picked.topk(k)
        top_probs = (top_logits - picked.logsumexp(-1, keepdim=True)).exp()
        return lambda: (best.tolist(), top_ids.tolist(), top_probs.tolist())
