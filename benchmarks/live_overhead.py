"""What kvscope's recorder costs a vLLM server (`python -m benchmarks.live_overhead`).

Two servers with the same model and pool, one with vLLM's own scheduler and one with
explorer.drivers.vllm_live.RecordingScheduler. The same OpenAI traffic (concurrent completions,
greedy, fixed lengths) goes to one server at a time, alternating, for `rounds` rounds each:
plain, recorder with a subscriber draining its feed (the realistic cost: every step is
built and sent), recorder with nobody listening. Prints tokens/s per round and the median
ratio to plain, and vLLM's own mean inter-token latency (its Prometheus histogram) as the
step time. On a shared 2-core machine the spread between rounds is large: read the medians.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import re
import statistics
import threading
import time
import urllib.request
from collections.abc import Sequence

from explorer.drivers.vllm_live.server import VllmServer


def _itl(server: VllmServer) -> tuple[float, float]:
    text = urllib.request.urlopen(f"{server.http}/metrics", timeout=10).read().decode()
    total = count = 0.0
    for name, value in re.findall(r'^vllm:inter_token_latency_seconds_(sum|count)\{[^}]*\} ([0-9.e+-]+)$', text, re.M):
        if name == "sum":
            total += float(value)
        else:
            count += float(value)
    return total, count


def one_round(server: VllmServer, prompts: list[str], max_tokens: int) -> dict:
    client = server.client()
    s0, c0 = _itl(server)
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        outs = list(pool.map(lambda p: client.completions.create(
            model=server.model, prompt=p, max_tokens=max_tokens, temperature=0.0,
            extra_body={"ignore_eos": True}), prompts))
    wall = time.perf_counter() - t0
    s1, c1 = _itl(server)
    tokens = sum(o.usage.completion_tokens for o in outs)
    return {"tok_s": tokens / wall, "itl_ms": (s1 - s0) / max(1.0, c1 - c0) * 1e3, "tokens": tokens}


class Drain:
    """A subscriber that reads and discards the feed (decoding each message, as a client does)."""

    def __init__(self, address: str) -> None:
        import zmq

        from explorer.drivers.vllm_live import protocol

        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, protocol.TOPIC)
        self.sock.connect(address)
        self.count, self.running, self.counters, self.first = 0, True, {}, {}
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        from explorer.drivers.vllm_live import protocol

        while self.running:
            if self.sock.poll(100):
                self.counters = protocol.decode_feed(self.sock.recv_multipart()).counters
                self.first = self.first or self.counters
                self.count += 1

    def close(self) -> None:
        self.running = False
        self.thread.join(timeout=2)
        self.sock.close(0)
        self.ctx.term()


def measure(model: str, *, rounds: int = 3, num_requests: int = 8, prompt_words: int = 60, max_tokens: int = 64,
            num_gpu_blocks: int = 128, progress=print) -> dict:
    prompts = [f"Request {i}: " + "tell me about the sea and its ships " * (prompt_words // 8)
               for i in range(num_requests)]
    common = dict(num_gpu_blocks=num_gpu_blocks, max_num_batched_tokens=256, kv_events=False)
    plain = VllmServer(model, recorder=False, **common)
    rec = VllmServer(model, recorder=True, **common)
    results: dict[str, list[dict]] = {"plain": [], "recorder+subscriber": [], "recorder, no subscriber": []}
    try:
        for s in (plain, rec):
            s.start()
        for s in (plain, rec):
            s.wait_ready(600)
        progress(f"both servers up (logs: {plain.log_path}, {rec.log_path}); warming up")
        one_round(plain, prompts, 8)
        one_round(rec, prompts, 8)
        for r in range(rounds):
            for name in results:
                if name == "plain":
                    out = one_round(plain, prompts, max_tokens)
                elif name == "recorder+subscriber":
                    drain = Drain(rec.feed)
                    time.sleep(0.3)
                    try:
                        out = one_round(rec, prompts, max_tokens)
                    finally:
                        time.sleep(0.3)
                        out["messages"] = drain.count
                        first, last = drain.first, drain.counters
                        if first and last.get("steps", 0) > first.get("steps", 0):
                            steps = last["steps"] - first["steps"]
                            out["recorder_ms_per_step"] = (last["recorder_ms"] - first["recorder_ms"]) / steps
                            out["recorder_cpu_ms_per_step"] = (
                                last["recorder_cpu_ms"] - first["recorder_cpu_ms"]) / steps
                        drain.close()
                else:
                    out = one_round(rec, prompts, max_tokens)
                results[name].append(out)

                progress(f"round {r + 1} {name:>24}: {out['tok_s']:7.1f} tok/s, ITL {out['itl_ms']:6.1f} ms"
                         + (f", {out['messages']} feed messages read" if "messages" in out else "")
                         + (f", recorder {out['recorder_ms_per_step']:.2f} ms/step on the scheduler thread "
                            f"({out['recorder_cpu_ms_per_step']:.2f} ms of CPU)"
                            if "recorder_ms_per_step" in out else ""))
    finally:
        plain.stop()
        rec.stop()
    base = statistics.median(x["tok_s"] for x in results["plain"])
    base_itl = statistics.median(x["itl_ms"] for x in results["plain"])
    summary = {name: {"median_tok_s": statistics.median(x["tok_s"] for x in xs),
                      "tok_s_ratio": statistics.median(x["tok_s"] for x in xs) / base,
                      "median_itl_ms": statistics.median(x["itl_ms"] for x in xs),
                      "itl_ratio": statistics.median(x["itl_ms"] for x in xs) / base_itl,
                      "spread_tok_s": [min(x["tok_s"] for x in xs), max(x["tok_s"] for x in xs)]}
               for name, xs in results.items()}
    for key in ("recorder_ms_per_step", "recorder_cpu_ms_per_step"):
        own = [x[key] for x in results["recorder+subscriber"] if key in x]
        if own:
            summary["recorder+subscriber"][key] = statistics.median(own)
    return {"rounds": results, "summary": summary,
            "workload": {"num_requests": num_requests, "max_tokens": max_tokens, "prompt_words": prompt_words}}


def main(argv: Sequence[str] | None = None) -> int:
    from engine.default_model import default_model_path

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    a = p.parse_args(argv)
    out = measure(a.model or str(default_model_path()), rounds=a.rounds, num_requests=a.requests,
                  max_tokens=a.max_tokens)
    import platform
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    print(f"CPU: {cpu}")
    print(f"{'':>24}  {'tok/s':>8}  {'ratio':>6}  {'ITL ms':>7}  {'ratio':>6}")
    for name, s in out["summary"].items():
        print(f"{name:>24}  {s['median_tok_s']:8.1f}  {s['tok_s_ratio']:6.3f}  {s['median_itl_ms']:7.1f}  "
              f"{s['itl_ratio']:6.3f}")
    rs = out["summary"]["recorder+subscriber"]
    if "recorder_ms_per_step" in rs:
        itl = out["summary"]["plain"]["median_itl_ms"]
        print(f"the recorder's own time per step (median of the rounds): {rs['recorder_ms_per_step']:.2f} ms wall "
              f"= {rs['recorder_ms_per_step'] / itl * 100:.1f}% of plain's ITL; "
              f"{rs['recorder_cpu_ms_per_step']:.2f} ms of CPU = {rs['recorder_cpu_ms_per_step'] / itl * 100:.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
