"""The embedded model on its own Q4_1/Q8_0 blocks (`quantization="auto"`) against the same blocks, dequantized."""

from __future__ import annotations

import pytest
import torch
from skiff import SamplingParams
from skiff.kernels import cpu as cpu_kernels
from skiff.layers.quant import resolve_quantization
from skiff_rt_helpers import chat_prompt_ids, make_llm, teacher_forced_divergences

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="no C++ compiler for the CPU kernels")

PROMPTS, TOKENS = 16, 64


@pytest.fixture(scope="module")
def smollm_default():
    llm = make_llm(None, quantization="auto", max_total_tokens=8192)  # a GGUF on CPU: its own blocks
    yield llm
    llm.shutdown()


def test_auto_on_a_gguf_is_its_own_blocks(smollm_default, smollm) -> None:
    assert smollm_default.engine.runner.quantization == "gguf"
    assert smollm.engine.runner.quantization is None  # quantization="none": the fp32 reference
    # the KV cache on the blocks is fp16 (as llama.cpp's); the agreement test below runs on it
    assert smollm_default.engine.runner.kv_dtype == torch.float16
    assert smollm.engine.runner.kv_dtype == torch.float32
    cpu, fp32 = torch.device("cpu"), torch.float32
    assert resolve_quantization("auto", False, cpu, fp32) is None  # an HF directory keeps float weights
    assert resolve_quantization("auto", True, torch.device("cuda"), torch.bfloat16) is None
    with pytest.raises(ValueError, match="not a .gguf"):
        resolve_quantization("gguf", False, cpu, fp32)
    with pytest.raises(ValueError, match="CPU"):
        resolve_quantization("gguf", True, torch.device("cuda"), torch.bfloat16)


def test_greedy_tokens_agree_with_the_dequantized_reference(smollm_default, smollm, tokenizer) -> None:
    prompts = chat_prompt_ids(tokenizer)[:PROMPTS]
    outs = smollm_default.generate(
        prompts, SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True)
    )
    tokens = [o.token_ids for o in outs]
    assert "Paris" in tokenizer.decode(tokens[0])
    total = sum(map(len, tokens))
    assert total == PROMPTS * TOKENS
    # teacher-forced: at each position of the native greedy run, the fp32 reference's argmax given the same
    # prefix; near-ties (reference top-2 within TIE_TOL) count as agreement, as in the HF parity tests
    divs = teacher_forced_divergences(prompts, tokens, smollm.prefill_logits)
    hard = [d for d in divs if not d.near_tie]
    agreement = 1 - len(hard) / total
    assert agreement >= 0.99, f"agreement {agreement:.4f} at {total} positions:\n" + "\n".join(
        map(str, hard[:10])
    )
