"""`skiff bench offline`: the seed's throughput workload on the in-process engine (`skiff.LLM`).

Default workload (see the anchors): 256 sequences, `random.seed(0)`; prompt i is
`[randint(0, 10000) for _ in range(randint(100, 1024))]`, then max_tokens i is `randint(100, 1024)`,
temperature 0.6, EOS ignored: 133,966 output tokens. Throughput = output tokens / wall time of one
`generate` call, after a warm-up.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class OfflineWorkload:
    num_seqs: int = 256
    min_input_len: int = 100
    max_input_len: int = 1024
    min_output_len: int = 100
    max_output_len: int = 1024
    max_token_id: int = field(default=10000, metadata={"help": "prompt token ids are drawn from [0, this]"})
    temperature: float = 0.6
    seed: int = 0
    ignore_eos: bool = True

    def build(self) -> tuple[list[list[int]], list[int]]:
        rng = random.Random(self.seed)
        prompts = [
            [
                rng.randint(0, self.max_token_id)
                for _ in range(rng.randint(self.min_input_len, self.max_input_len))
            ]
            for _ in range(self.num_seqs)
        ]
        outputs = [rng.randint(self.min_output_len, self.max_output_len) for _ in range(self.num_seqs)]
        return prompts, outputs


def run_offline(
    workload: OfflineWorkload, engine_kwargs: dict[str, Any], warmup: bool = True
) -> dict[str, Any]:
    from skiff import LLM, SamplingParams

    prompts, outputs = workload.build()
    t_load = time.perf_counter()
    llm = LLM(**engine_kwargs)
    load_s = time.perf_counter() - t_load
    try:
        params = [
            SamplingParams(max_tokens=n, temperature=workload.temperature, ignore_eos=workload.ignore_eos)
            for n in outputs
        ]
        if warmup:
            llm.generate(
                prompts[: min(4, len(prompts))],
                SamplingParams(max_tokens=8, temperature=workload.temperature),
            )
        t0 = time.perf_counter()
        results = llm.generate(prompts, params)
        wall = time.perf_counter() - t0
        stats = llm.engine.stats()
        llm.engine.check_integrity()
    finally:
        llm.shutdown()
    out_tokens = sum(len(r.token_ids) for r in results)
    in_tokens = sum(len(p) for p in prompts)
    return {
        "workload": asdict(workload),
        "engine": {k: v for k, v in engine_kwargs.items() if v is not None},
        "load_seconds": load_s,
        "wall_seconds": wall,
        "input_tokens": in_tokens,
        "output_tokens": out_tokens,
        "expected_output_tokens": sum(outputs),
        "output_throughput": out_tokens / wall,
        "total_throughput": (in_tokens + out_tokens) / wall,
        "requests_per_second": len(prompts) / wall,
        "num_preemptions": getattr(stats, "num_preemptions", None),
    }
