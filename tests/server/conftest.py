"""Real `skiff serve` subprocesses, shared across tests: loading the model costs seconds."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.serve import ServerProcess


@pytest.fixture(scope="session")
def server() -> Iterator[ServerProcess]:
    srv = ServerProcess("--num-tokenizers", "2", "--max-body-mb", "1").wait_ready()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def client(server: ServerProcess):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key=server.api_key, timeout=120, max_retries=0)
