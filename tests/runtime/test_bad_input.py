"""Bad requests and bad models get a clear exception that names the problem; the engine keeps serving."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file
from skiff import InvalidRequest, SamplingParams
from skiff_rt_helpers import make_llm, random_prompts

OK = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir, llm_factory_module):
    return llm_factory_module(tiny_llama_dir, max_total_tokens=2048, context_length=128)


@pytest.mark.parametrize(
    "bad",
    [
        dict(max_tokens=0),
        dict(max_tokens=-3),
        dict(temperature=-0.5),
        dict(top_p=0.0),
        dict(top_p=1.5),
        dict(top_k=-2),
        dict(min_p=2.0),
        dict(repetition_penalty=0.0),
        dict(presence_penalty=5.0),
        dict(top_logprobs=50),
        dict(stop_token_ids=[-1]),
        dict(seed="x"),
    ],
)
def test_bad_sampling_params(bad):
    key = next(iter(bad))
    with pytest.raises(InvalidRequest, match=key):
        SamplingParams(**bad)


def test_empty_prompt(tiny):
    with pytest.raises(InvalidRequest, match="empty"):
        tiny.generate([[]], OK)


def test_empty_text_prompt(tiny):
    with pytest.raises(InvalidRequest, match="empty"):
        tiny.generate([""], OK)


def test_prompt_over_context_length(tiny):
    with pytest.raises(InvalidRequest, match="context length"):
        tiny.generate([random_prompts(1, seed=90, lo=200, hi=200)[0]], OK)
    with pytest.raises(InvalidRequest, match="context length"):
        tiny.generate([random_prompts(1, seed=90, lo=128, hi=128)[0]], OK)


def test_token_ids_outside_vocab(tiny):
    with pytest.raises(InvalidRequest, match="token ids"):
        tiny.generate([[5, 10**6]], OK)
    with pytest.raises(InvalidRequest, match="token ids"):
        tiny.generate([[5, -1]], OK)


def test_params_count_mismatch(tiny):
    with pytest.raises(InvalidRequest):
        tiny.generate([[5, 6], [7, 8]], [OK, OK, OK])


def test_bad_request_in_a_batch_loses_nothing(tiny):
    good = random_prompts(2, seed=91, lo=5, hi=20)
    ref = [o.token_ids for o in tiny.generate(good, OK)]
    with pytest.raises(InvalidRequest):
        tiny.generate([good[0], [], good[1]], OK)
    st = tiny.engine.stats()
    assert st.num_running == 0 and st.num_queued == 0
    tiny.engine.check_integrity()
    assert [o.token_ids for o in tiny.generate(good, OK)] == ref


# ---------------------------------------------------------------------------------------------- bad models


def test_unknown_model_path(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        make_llm(missing)


def test_directory_without_config(tmp_path):
    (tmp_path / "empty-model").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        make_llm(tmp_path / "empty-model")


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_corrupt_safetensors(tiny_llama_dir, tmp_path):
    d = _copy(tiny_llama_dir, tmp_path / "corrupt")
    (d / "model.safetensors").write_bytes(b"\x07" * 4096)
    with pytest.raises(ValueError, match="model.safetensors"):
        make_llm(d)


def test_truncated_safetensors(tiny_llama_dir, tmp_path):
    d = _copy(tiny_llama_dir, tmp_path / "truncated")
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="model.safetensors"):
        make_llm(d)


def test_missing_shard(random_model, tmp_path):
    d = _copy(random_model("llama_llama3_rope_sharded"), tmp_path / "missing-shard")
    shard = sorted(d.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=shard.name):
        make_llm(d)


def test_corrupt_gguf(embedded_path, tmp_path):
    bad = tmp_path / "broken.gguf"
    with open(embedded_path, "rb") as f:
        bad.write_bytes(f.read(1 << 20))  # a valid header, then the file stops
    with pytest.raises(ValueError, match="broken.gguf"):
        make_llm(bad)


def test_not_a_model_file(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"hello")
    with pytest.raises(ValueError, match="weights.bin"):
        make_llm(f)


def test_unsupported_architecture(tiny_llama_dir, tmp_path):
    d = _copy(tiny_llama_dir, tmp_path / "gpt2")
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(architectures=["GPT2LMHeadModel"], model_type="gpt2")
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="(?i)gpt2"):
        make_llm(d)


def test_mismatched_shape(tiny_llama_dir, tmp_path):
    d = _copy(tiny_llama_dir, tmp_path / "shape")
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = cfg["intermediate_size"] * 2
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="(?i)shape.*mlp|mlp.*shape"):
        make_llm(d)


def test_missing_tensor(tiny_llama_dir, tmp_path):
    d = _copy(tiny_llama_dir, tmp_path / "missing-tensor")
    tensors = load_file(str(d / "model.safetensors"))
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"layers\.1\.self_attn"):
        make_llm(d)
