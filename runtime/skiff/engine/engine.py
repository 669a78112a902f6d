"""Engine: the scheduler, the model runner and the sampler behind one step() call (rank 0 of TP)."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from skiff.config import EngineConfig
from skiff.distributed.parallel import destroy_tensor_parallel, init_tensor_parallel
from skiff.engine.forward_batch import slots_for
from skiff.engine.host_memory import retain_freed_heap
from skiff.engine.model_runner import ModelRunner, resolve_device, resolve_dtype
from skiff.engine.plan import make_plan, plan_to_batch
from skiff.engine.sampler import sample, sample_on_host
from skiff.engine.tp_workers import PlanPublisher, free_port, spawn_followers
from skiff.kvcache.manager import CACHE_MANAGERS
from skiff.loader import read_config, resolve_model_path
from skiff.loader.checkpoint import gguf_as_hf_dir
from skiff.models import ModelConfig
from skiff.outputs import StepOutput
from skiff.params import InvalidRequest, SamplingParams
from skiff.scheduler.request import Req
from skiff.scheduler.scheduler import ScheduleBatch, Scheduler
from skiff.tokenizer import cache_dir

log = logging.getLogger(__name__)


@dataclass
class EngineStats:
    num_running: int
    num_queued: int
    total_pages: int
    free_pages: int
    cached_pages: int
    used_pages: int  # private pages of live requests
    token_usage: float  # share of the pool not free
    cache_hit_tokens: int
    prompt_tokens: int
    generation_tokens: int
    num_preemptions: int
    page_size: int

    @property
    def cache_hit_rate(self) -> float:
        return self.cache_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def checkpoint_dir(cfg: EngineConfig) -> tuple[Path, Path]:
    """(original model path, path to load weights from): GGUF files load through a dequantized cache."""
    path = resolve_model_path(cfg.model)
    if path.is_file() and path.suffix == ".gguf":
        return path, gguf_as_hf_dir(path, cache_dir()) or path
    return path, path


def load_runner(cfg: EngineConfig, rank: int, dist_port: int | None) -> ModelRunner:
    device = resolve_device(cfg)
    if device.type == "cuda" and cfg.tp > 1:
        device = torch.device("cuda", rank)
    if device.type == "cpu":
        torch.set_num_threads(cfg.num_threads or max(1, torch.get_num_threads() // cfg.tp))
        retain_freed_heap()
    init_tensor_parallel(rank, cfg.tp, dist_port or 0, device)
    _, weights = checkpoint_dir(cfg)
    raw = read_config(weights)
    return ModelRunner(cfg, weights, raw, ModelConfig.from_hf(raw), device, resolve_dtype(cfg, device))


def _eos_ids(model_cfg: ModelConfig, weights: Path) -> list[int]:
    ids = set(model_cfg.eos_token_ids)
    gen = weights / "generation_config.json" if weights.is_dir() else None
    if gen is not None and gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
    return sorted(ids)


class Engine:
    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        torch.manual_seed(cfg.seed)
        self.followers = []
        self.publisher: PlanPublisher | None = None
        dist_port = cfg.dist_port or (free_port() if cfg.tp > 1 else None)
        if cfg.tp > 1:
            self.publisher = PlanPublisher(cfg.tp - 1)
            self.followers = spawn_followers(cfg, dist_port, self.publisher.port)
        self.runner = load_runner(cfg, 0, dist_port)
        if self.publisher is not None:
            self.publisher.wait_for_followers(self.followers)
        self.model_path, weights = checkpoint_dir(cfg)
        self.model_config = self.runner.model_cfg
        self.eos_token_ids = _eos_ids(self.model_config, weights)
        self.max_context_len = min(
            cfg.context_length or self.model_config.max_position, self.model_config.max_position
        )
        self.cache = CACHE_MANAGERS[cfg.cache](self.runner.num_pages, cfg.page_size)
        self.scheduler = Scheduler(cfg, self.cache)
        self._arrivals = 0
        self._finished: list[StepOutput] = []
        self.prompt_tokens = self.cache_hit_tokens = self.generation_tokens = 0
        self.closed = False
        self.overlap = None
        if not cfg.disable_overlap and self.runner.device.type == "cuda" and cfg.tp == 1:
            from skiff.engine.overlap import OverlapLoop

            self.overlap = OverlapLoop(self)

    # ------------------------------------------------------------------------------------------ requests
    def add_request(self, rid: str, input_ids: list[int], params: SamplingParams) -> None:
        if not input_ids:
            raise InvalidRequest("the prompt is empty: at least one token is required")
        if len(input_ids) >= self.max_context_len:
            raise InvalidRequest(
                f"the prompt has {len(input_ids)} tokens, but the context length is "
                f"{self.max_context_len} (prompt plus at least one generated token)"
            )
        vocab = self.model_config.vocab_size
        if any(not 0 <= t < vocab for t in input_ids):
            raise InvalidRequest(f"prompt token ids must be in [0, {vocab})")
        capacity = self.cache.total_pages * self.cfg.page_size
        if len(input_ids) >= capacity:
            raise InvalidRequest(
                f"the prompt has {len(input_ids)} tokens, more than the KV cache holds ({capacity})"
            )
        params.validate()
        gen = None
        if params.seed is not None and not params.greedy:
            gen = torch.Generator(device=self.runner.device).manual_seed(params.seed)
        self._arrivals += 1
        self.scheduler.enqueue(Req(rid, list(input_ids), params, self._arrivals, generator=gen))

    def abort_request(self, rid: str) -> None:
        r = self.scheduler.remove(rid)
        if r is not None:
            r.finish_reason = "abort"
            self._finished.append(self._output(r, [], "abort"))

    @property
    def has_work(self) -> bool:
        pending = self.overlap is not None and self.overlap.pending is not None
        return bool(self.scheduler.waiting or self.scheduler.running or self._finished or pending)

    # ------------------------------------------------------------------------------------------ stepping
    def step(self) -> list[StepOutput]:
        self._check_followers()
        if self.overlap is not None:
            return self.overlap.step()
        outputs, self._finished = self._finished, []
        batch = self.scheduler.schedule()
        for r in self.scheduler.starved:
            self.scheduler.finish(r)
            outputs.append(self._output(r, [], "length"))
        self.scheduler.starved.clear()
        if batch is None:
            return outputs
        logits = self._forward(make_plan(batch, self.cfg.page_size))
        outputs.extend(self._process(batch, logits))
        return outputs

    def _forward(self, plan: dict) -> torch.Tensor:
        if self.publisher is not None:
            self.publisher.publish(plan)
        return self.runner.forward(plan_to_batch(plan, self.cfg.page_size, self.runner.device))

    def _process(self, batch: ScheduleBatch, logits: torch.Tensor) -> list[StepOutput]:
        sampling = [s for s in batch.seqs if s.samples]
        reqs = [s.req for s in sampling]
        sampler = sample_on_host if logits.is_cuda else sample
        result = (
            sampler(
                logits,
                [r.params for r in reqs],
                [r.generator for r in reqs],
                [r.prompt_ids for r in reqs],
                [r.output_ids for r in reqs],
            )
            if reqs
            else None
        )
        for s in batch.seqs:
            s.req.kv_len = s.start + s.q_len
            if not s.req.prompt_cached and s.req.kv_len >= len(s.req.prompt_ids):
                s.req.prompt_cached = True
                self.prompt_tokens += len(s.req.prompt_ids)
                self.cache_hit_tokens += s.req.cached_tokens
                self.cache.cache_prompt(s.req)
        outputs = []
        for i, r in enumerate(reqs):
            assert result is not None
            token = result.tokens[i]
            r.output_ids.append(token)
            self.generation_tokens += 1
            lp = [result.logprobs[i]] if result.logprobs is not None and r.params.logprobs else None
            top = (
                [result.top_logprobs[i]]
                if result.top_logprobs is not None and r.params.top_logprobs
                else None
            )
            reason = self._finish_reason(r, token)
            if reason is not None:
                self.scheduler.finish(r)
            outputs.append(self._output(r, [token], reason, lp, top))
        return outputs

    def _finish_reason(self, r: Req, token: int, num_output: int | None = None) -> str | None:
        p = r.params
        if (token in self.eos_token_ids and not p.ignore_eos) or token in p.stop_token_ids:
            r.matched_stop = token
            return "stop"
        n = len(r.output_ids) if num_output is None else num_output  # overlap: placeholders not counted
        if n >= p.max_tokens or len(r.prompt_ids) + n >= self.max_context_len:
            return "length"
        return None

    def _output(
        self,
        r: Req,
        tokens: list[int],
        reason: str | None,
        lp: list[float] | None = None,
        top: list[dict[int, float]] | None = None,
        num_output: int | None = None,
    ) -> StepOutput:
        return StepOutput(
            r.rid,
            tokens,
            lp,
            top,
            reason,
            r.matched_stop if reason == "stop" else None,  # type: ignore[arg-type]
            len(r.prompt_ids),
            r.cached_tokens,
            len(r.output_ids) if num_output is None else num_output,
        )

    # ------------------------------------------------------------------------------------------ inspection
    def prefill_logits(self, token_ids: list[int]) -> torch.Tensor:
        """Logits at every position of one prompt, computed through the paged cache, then freed."""
        n = len(token_ids)
        if not 0 < n < self.max_context_len:
            raise InvalidRequest(f"prompt length {n} is outside (0, {self.max_context_len})")
        pages = self.cache.alloc(-(-n // self.cfg.page_size))
        if pages is None:
            raise InvalidRequest("the KV cache has no room for this prompt now")
        try:
            r = Req("prefill_logits", list(token_ids), SamplingParams(), 0, pages=pages)
            plan = {
                "op": "forward",
                "ids": list(token_ids),
                "pos": list(range(n)),
                "slots": slots_for(pages, 0, n, self.cfg.page_size),
                "rows": list(range(n)),
                "q_lens": [n],
                "seq_lens": [n],
                "tables": [r.pages],
                "nd": 0,
            }
            return self._forward(plan)
        finally:
            self.cache.allocator.free(pages)

    def stats(self) -> EngineStats:
        c = self.cache
        used = sum(len(r.pages) - r.cached_pages for r in self.scheduler.running)
        free = c.allocator.num_free
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_queued=len(self.scheduler.waiting),
            total_pages=c.total_pages,
            free_pages=free,
            cached_pages=c.num_cached_pages,
            used_pages=used,
            token_usage=1.0 - (free + c.num_evictable_pages) / c.total_pages if c.total_pages else 0.0,
            cache_hit_tokens=self.cache_hit_tokens,
            prompt_tokens=self.prompt_tokens,
            generation_tokens=self.generation_tokens,
            num_preemptions=self.scheduler.num_retractions,
            page_size=self.cfg.page_size,
        )

    def check_integrity(self) -> None:
        self.cache.check(self.scheduler.running)

    def _check_followers(self) -> None:
        dead = [p.name for p in self.followers if not p.is_alive()]
        if dead:
            raise RuntimeError(f"tensor-parallel process(es) {dead} exited")

    def shutdown(self, timeout: float = 10.0) -> None:
        if self.closed:
            return
        self.closed = True
        if self.publisher is not None:
            if all(p.is_alive() for p in self.followers):
                self.publisher.publish({"op": "exit"})
            deadline = time.monotonic() + timeout
            for p in self.followers:
                p.join(max(0.1, deadline - time.monotonic()))
                if p.is_alive():
                    p.terminate()
            self.publisher.close()
            destroy_tensor_parallel()  # the process group is this engine's (only a tp > 1 engine makes one)
