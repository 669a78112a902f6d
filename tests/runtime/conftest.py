"""Fixtures of the runtime tests. Expensive objects (the embedded model in Skiff and in HF transformers, the
random-weight model directories) are built once per session; every engine a test touches is checked for
page integrity after the test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from skiff_rt_helpers import LIVE_ENGINES, assert_engine_clean, make_llm
from support.random_models import build_random_model


@pytest.fixture(autouse=True)
def _engines_stay_consistent() -> Iterator[None]:
    yield
    for llm in list(LIVE_ENGINES):
        if not llm.engine.closed:
            assert_engine_clean(llm)


@pytest.fixture
def llm_factory():
    """Function-scoped engines: integrity-checked, then shut down, at teardown."""
    made = []

    def factory(model=None, **kwargs):
        llm = make_llm(model, **kwargs)
        made.append(llm)
        return llm

    yield factory
    for llm in made:
        try:
            if not llm.engine.closed:
                assert_engine_clean(llm)
        finally:
            llm.shutdown()


@pytest.fixture(scope="module")
def llm_factory_module():
    """Module-scoped engines, checked and shut down when the module ends."""
    made = []

    def factory(model=None, **kwargs):
        made.append(make_llm(model, **kwargs))
        return made[-1]

    yield factory
    for llm in made:
        try:
            assert_engine_clean(llm)
        finally:
            llm.shutdown()


@pytest.fixture(scope="session")
def embedded_path() -> Path:
    from skiff.embedded import embedded_model_path

    return embedded_model_path()


@pytest.fixture(scope="session")
def smollm():
    """Skiff on the embedded SmolLM2-135M-Instruct dequantized to fp32 (the reference), default radix cache."""
    llm = make_llm(None, max_total_tokens=16384, quantization="none")
    yield llm
    llm.shutdown()


@pytest.fixture(scope="session")
def tokenizer(smollm):
    return smollm.tokenizer


@pytest.fixture(scope="session")
def hf_smollm(embedded_path):
    """HF transformers' own loading of the same GGUF file: the reference."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(embedded_path.parent), gguf_file=embedded_path.name, dtype=torch.float32
    )
    return model.eval()


@pytest.fixture(scope="session")
def model_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("random_models")


@pytest.fixture(scope="session")
def random_model(model_root, embedded_path):
    """random_model(name) -> directory of a random-weight model (built once per session)."""
    from skiff.tokenizer import load_tokenizer

    tok = load_tokenizer(embedded_path)
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            built[name] = build_random_model(name, model_root, tok)
        return built[name]

    return get


@pytest.fixture(scope="session")
def tiny_llama_dir(random_model) -> Path:
    return random_model("tiny_llama")
