"""Server settings: the engine's `EngineConfig` plus what only the pod's process set needs."""

from __future__ import annotations

from dataclasses import dataclass, field

from skiff.config import EngineConfig
from skiff.embedded import EMBEDDED_NAME, embedded_model_path


@dataclass
class ServerArgs:
    engine: EngineConfig = field(default_factory=EngineConfig)
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    api_key_file: str | None = None  # one key per line, re-read when it changes (auth.KeyRing)
    metrics_port: int | None = None  # /metrics on its own port (and not on `port`); None: on `port`
    num_tokenizers: int = 1
    log_level: str = "info"
    grace_period: float = 30.0  # seconds in-flight requests get to finish after SIGTERM
    max_body_bytes: int = 32 * 1024 * 1024
    max_n: int = 128  # largest `n` (choices per prompt) one request may ask for
    startup_timeout: float = 900.0
    ipc_dir: str | None = None  # where the ipc:// sockets live; None: a fresh temporary directory
    tool_call_parser: str = "auto"  # a name in tool_calls.TOOL_PARSERS, "auto" (from the template) or "none"
    reasoning_parser: str = "auto"  # a name in reasoning.REASONING_PARSERS, "auto" or "none"

    @property
    def tokenizer_path(self) -> str:
        path = self.engine.tokenizer or self.engine.model
        return str(path) if path else str(embedded_model_path())

    @property
    def model_name(self) -> str:
        if self.engine.served_model_name:
            return self.engine.served_model_name
        if not self.engine.model:
            return EMBEDDED_NAME
        return str(self.engine.model).rstrip("/").split("/")[-1].removesuffix(".gguf")
