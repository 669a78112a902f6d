"""Per-request sampling parameters (the offline API's and the server's common currency)."""

from __future__ import annotations

from dataclasses import dataclass, field

from skiff.constrained.grammar import Grammar


class InvalidRequest(ValueError):
    """A request that can never be served as given (bad parameter, prompt too long, ...)."""


@dataclass
class SamplingParams:
    max_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: disabled
    min_p: float = 0.0
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: bool = False
    top_logprobs: int = 0
    priority: int = 0  # larger is scheduled first when the scheduler runs with priorities
    skip_special_tokens: bool = True
    grammar: Grammar | None = None  # constrained decoding: the output must match it

    def __post_init__(self) -> None:
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def validate(self) -> None:
        checks: list[tuple[bool, str]] = [
            (
                isinstance(self.max_tokens, int) and self.max_tokens >= 1,
                f"max_tokens must be >= 1, got {self.max_tokens}",
            ),
            (0.0 <= self.temperature <= 100.0, f"temperature must be in [0, 100], got {self.temperature}"),
            (0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}"),
            (self.top_k == -1 or self.top_k >= 0, f"top_k must be -1 (disabled) or >= 0, got {self.top_k}"),
            (0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}"),
            (
                -2.0 <= self.presence_penalty <= 2.0,
                f"presence_penalty must be in [-2, 2], got {self.presence_penalty}",
            ),
            (
                -2.0 <= self.frequency_penalty <= 2.0,
                f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}",
            ),
            (
                0.0 < self.repetition_penalty <= 10.0,
                f"repetition_penalty must be in (0, 10], got {self.repetition_penalty}",
            ),
            (0 <= self.top_logprobs <= 20, f"top_logprobs must be in [0, 20], got {self.top_logprobs}"),
            (
                all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
                "stop_token_ids must be non-negative ints",
            ),
            (all(isinstance(s, str) and s for s in self.stop), "stop strings must be non-empty strings"),
            (self.seed is None or isinstance(self.seed, int), f"seed must be an integer, got {self.seed!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidRequest(message)

    @property
    def needs_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0
