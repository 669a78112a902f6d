"""Engine: the scheduler, the model runner and the sampler behind one step() call (rank 0 of TP).

One loop serves both modes. With a lag of 1 (overlap scheduling, CUDA) the host schedules and launches
batch k+1 while the GPU still runs batch k: after batch k is launched, its requests are advanced
optimistically (kv_len moves past the computed tokens, each sampling request gets a placeholder output
token `-(row + 1)` naming its row in batch k's sampled tokens, which stay on the GPU). Batch k+1 is then
scheduled as if k were done; one GPU gather replaces its placeholders with batch k's tokens in stream order.
Only then does the host wait for batch k's tokens, fill the placeholders in and finish requests. With a lag
of 0 the same launch is completed at once.

A request that finishes in batch k was already part of batch k+1: its k+1 row is computed and discarded
(its pages are freed after k+1 was enqueued, and every later batch runs after k+1 on the same stream).
Penalties and grammar masks read the previous token on the host: when a batch holds such a request, the
pending batch is completed after this batch's forward is enqueued and before it is sampled, so the host
waits for the pending tokens (and fills the masks) while the device runs the forward.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from skiff.config import EngineConfig
from skiff.constrained.masks import GrammarMasks, advance
from skiff.distributed.parallel import destroy_tensor_parallel
from skiff.engine.loading import eos_token_ids, load_runner
from skiff.engine.plan import StepPlan, StopFollowers, make_plan, plan_to_batch, prompt_plan
from skiff.engine.request_rules import check_prompt, context_limit, finish_reason
from skiff.engine.sampler import DeviceSample, HostSample, SampleInputs, sample, sample_device
from skiff.engine.stats import EngineStats
from skiff.engine.tp_workers import PlanPublisher, free_port, spawn_followers
from skiff.kvcache.manager import CACHE_MANAGERS
from skiff.outputs import FinishReason, RequestTiming, StepOutput
from skiff.params import InvalidRequest, SamplingParams
from skiff.scheduler.request import Req
from skiff.scheduler.scheduler import ScheduleBatch, Scheduler

log = logging.getLogger(__name__)


@dataclass
class Launched:
    """A batch whose forward and sampling are enqueued; its tokens are read in `_complete`."""

    sample: DeviceSample | HostSample | None
    rows: list[tuple[int, Req, int]]  # (row in the sampled tokens, request, index of its placeholder)


def resolve_placeholders(ids: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """ids with every -(i + 1) replaced by tokens[i], on the device."""
    pending = ids < 0
    return torch.where(pending, tokens[(-ids - 1).clamp_(min=0)], ids)


def _reads_host(r: Req) -> bool:
    """The request's sampling reads its previous token on the host (penalties, the grammar's mask)."""
    return r.params.needs_penalties or r.matcher is not None


def schedule_lag(cfg: EngineConfig, device: torch.device) -> int:
    """1: overlap scheduling. TP followers replay plans with real ids, so tp > 1 runs with a lag of 0."""
    if cfg.disable_overlap or cfg.tp > 1:
        return 0
    return 1 if device.type == "cuda" or cfg.overlap_on_cpu else 0


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
        self.model_path, weights = self.runner.model_path, self.runner.weights_path
        self.model_config = self.runner.model_cfg
        self.eos_token_ids = eos_token_ids(self.model_config, weights)
        self.max_context_len = context_limit(cfg, self.model_config)
        self.cache = CACHE_MANAGERS[cfg.cache](self.runner.num_pages, cfg.page_size)
        self.scheduler = Scheduler(cfg, self.cache)
        self.lag = schedule_lag(cfg, self.runner.device)
        tokenizer = cfg.tokenizer or str(self.model_path)
        self.grammars = GrammarMasks(tokenizer, self.model_config.vocab_size, sorted(self.eos_token_ids))
        self._pending: Launched | None = None
        self._arrivals = 0
        self._finished: list[StepOutput] = []
        self.timings: list[RequestTiming] = []  # of the requests whose first token the last step() gave
        self.prompt_tokens = self.cache_hit_tokens = self.generation_tokens = 0
        self.closed = False

    # ------------------------------------------------------------------------------------------ requests
    def add_request(self, rid: str, input_ids: list[int], params: SamplingParams, queued: int = 0) -> None:
        """`queued`: epoch ns the request began to wait for the engine (RequestTiming); 0: now."""
        capacity = self.cache.total_pages * self.cfg.page_size
        check_prompt(input_ids, self.max_context_len, self.model_config.vocab_size, capacity)
        params.validate()
        gen = None
        if params.seed is not None and not params.greedy:
            gen = torch.Generator(device=self.runner.device).manual_seed(params.seed)
        matcher = self.grammars.matcher(params.grammar) if params.grammar is not None else None
        self._arrivals += 1
        req = Req(rid, list(input_ids), params, self._arrivals, generator=gen, matcher=matcher)
        req.queued_ns = queued or time.time_ns()
        self.scheduler.enqueue(req)

    def abort_request(self, rid: str) -> None:
        r = self.scheduler.remove(rid)
        if r is not None:
            self._finished.append(self._end(r, "abort"))

    @property
    def has_work(self) -> bool:
        s = self.scheduler
        return bool(s.waiting or s.running or self._finished or self._pending is not None)

    # ------------------------------------------------------------------------------------------ stepping
    def step(self) -> list[StepOutput]:
        self._check_followers()
        outputs, self._finished = self._finished, []
        if self.timings:
            self.timings = []
        pending = self._pending
        batch = self.scheduler.schedule()
        for r in self.scheduler.starved:
            self.scheduler.finish(r)
            outputs.append(self._end(r, "length"))
        self.scheduler.starved.clear()
        launched = None
        if batch is not None:
            reqs = [s.req for s in batch.seqs if s.samples]
            logits = self._forward(make_plan(batch, self.cfg.page_size), pending)
            if pending is not None and any(_reads_host(r) for r in reqs):
                outputs.extend(self._complete(pending))
                pending = None
            launched = self._launch(batch, reqs, logits)
        if pending is not None:
            outputs.extend(self._complete(pending))
        if launched is not None and self.lag == 0:
            outputs.extend(self._complete(launched))
            launched = None
        self._pending = launched
        return outputs

    def _forward(self, plan: StepPlan, previous: Launched | None = None) -> torch.Tensor:
        if self.publisher is not None:
            self.publisher.publish(plan)
        batch = plan_to_batch(plan, self.cfg.page_size, self.runner.device)
        if previous is not None and previous.sample is not None and min(plan.ids) < 0:
            batch.input_ids = resolve_placeholders(batch.input_ids, previous.sample.tokens)
        return self.runner.forward(batch)

    def _launch(self, batch: ScheduleBatch, reqs: list[Req], logits: torch.Tensor) -> Launched:
        """Sample a batch whose forward is enqueued, then advance its requests optimistically."""
        inputs = SampleInputs.of(reqs)
        sampled, unmasked = None, None
        if any(r.matcher is not None for r in reqs):
            unmasked = logits
            logits = self.grammars.masked(
                logits, [r.matcher if r.finish_reason is None else None for r in reqs]
            )
        if reqs:
            if logits.is_cuda:
                sampled = sample_device(logits, inputs, unmasked)
            else:
                sampled = HostSample(sample(logits, inputs, unmasked))
        for s in batch.seqs:
            r = s.req
            if r.finish_reason is not None:
                continue
            r.kv_len = s.start + s.q_len
            if not r.prompt_cached and r.kv_len >= len(r.prompt_ids):
                r.prompt_cached = True
                self.prompt_tokens += len(r.prompt_ids)
                self.cache_hit_tokens += r.cached_tokens
                self.cache.cache_prompt(r)
        rows = []
        for i, r in enumerate(reqs):
            if r.finish_reason is None:
                r.output_ids.append(-(i + 1))
                rows.append((i, r, len(r.output_ids) - 1))
        return Launched(sampled, rows)

    def _complete(self, launched: Launched) -> list[StepOutput]:
        """The one place where sampled tokens become outputs and requests finish."""
        if launched.sample is None:
            return []
        result = launched.sample.resolve()
        outputs = []
        for i, r, idx in launched.rows:
            if r.finish_reason is not None:
                continue  # finished or aborted after this batch was launched
            token = result.tokens[i]
            r.output_ids[idx] = token
            if idx == 0:
                self.timings.append(RequestTiming(r.rid, r.queued_ns, r.scheduled_ns, time.time_ns()))
            self.generation_tokens += 1
            reason = finish_reason(
                r.params, token, self.eos_token_ids, len(r.prompt_ids), idx + 1, self.max_context_len
            )
            matched = token if reason == "stop" else None
            if r.matcher is not None and advance(r.matcher, token) and reason is None:
                reason = "stop"  # the grammar is complete: nothing but EOS could follow
            if reason is not None:
                del r.output_ids[idx + 1 :]  # the placeholder of a batch launched after this one
                r.finish_reason = reason
                r.matched_stop = matched
                if any(x is r for x in self.scheduler.running):
                    self.scheduler.finish(r)
                else:
                    self.scheduler.remove(r.rid)
            lp = [result.logprobs[i]] if result.logprobs is not None and r.params.logprobs else None
            top = (
                [result.top_logprobs[i]]
                if result.top_logprobs is not None and r.params.top_logprobs
                else None
            )
            prompt, cached = len(r.prompt_ids), r.cached_tokens
            outputs.append(
                StepOutput(r.rid, [token], lp, top, reason, r.matched_stop, prompt, cached, idx + 1)
            )
        return outputs

    def _end(self, r: Req, reason: FinishReason) -> StepOutput:
        """A request ended outside a step's tokens (aborted, or outgrew the KV pool)."""
        r.finish_reason = reason
        done = sum(1 for t in r.output_ids if t >= 0)  # a pending placeholder is not an output
        return StepOutput(r.rid, [], None, None, reason, None, len(r.prompt_ids), r.cached_tokens, done)

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
            return self._forward(prompt_plan(token_ids, pages, self.cfg.page_size))
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
                self.publisher.publish(StopFollowers())
            deadline = time.monotonic() + timeout
            for p in self.followers:
                p.join(max(0.1, deadline - time.monotonic()))
                if p.is_alive():
                    p.terminate()
            self.publisher.close()
            destroy_tensor_parallel()  # the process group is this engine's (only a tp > 1 engine makes one)
