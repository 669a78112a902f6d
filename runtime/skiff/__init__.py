"""Skiff: an SGLang-class LLM inference runtime."""

from skiff.config import EngineConfig
from skiff.outputs import RequestOutput, StepOutput
from skiff.params import InvalidRequest, SamplingParams

__all__ = ["LLM", "EngineConfig", "InvalidRequest", "RequestOutput", "SamplingParams", "StepOutput"]
__version__ = "0.1.0"


def __getattr__(name: str):  # LLM pulls in torch; keep `import skiff` light for the operator and the router
    if name == "LLM":
        from skiff.llm import LLM

        return LLM
    raise AttributeError(name)
