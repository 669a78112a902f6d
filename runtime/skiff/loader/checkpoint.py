"""Reading checkpoints tensor by tensor: HF safetensors directories and GGUF files.

Both readers yield (hf_name, tensor) in HF naming and layout, so one mapping loads either into the model.
With `native=True` a GGUF's tensors of a type that Skiff computes on (skiff.layers.gguf_quant) come as
`GGUFWeight` (the blocks as stored, q/k rows un-permuted) instead of float.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType

from skiff.layers.gguf_quant import KERNEL_TYPES, GGUFWeight


class CheckpointError(ValueError):
    """A weights file that is missing, unreadable or does not fit the model."""


def resolve_model_path(model: str | None) -> Path:
    if model is None:
        from skiff.embedded import embedded_model_path

        return embedded_model_path()
    p = Path(model).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"model path does not exist: {p}")
    return p


def read_config(path: Path) -> dict[str, Any]:
    """The HF-style config dict of a model directory or GGUF file."""
    if path.is_file():
        if path.suffix != ".gguf":
            raise CheckpointError(
                f"unsupported model file {path.name}: expected a .gguf file or an HF directory"
            )
        return _gguf_config(path)
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"no config.json in model directory {path}")
    try:
        return json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"corrupt config.json in {path}: {e}") from e


Tensor = torch.Tensor | GGUFWeight


def iter_tensors(path: Path, cfg: dict[str, Any], native: bool = False) -> Iterator[tuple[str, Tensor]]:
    if path.is_file():
        yield from _iter_gguf(path, cfg, native=native)
    else:
        yield from _iter_safetensors(path)


def _safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"corrupt safetensors index {index}: {e}") from e
        files = [path / f for f in dict.fromkeys(weight_map.values())]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"safetensors shards listed in {index.name} are missing: {missing}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in model directory {path}")
    return files


_GGUF_TYPES_KEY = "skiff.gguf_types"  # safetensors metadata of a block cache: {name: [ggml type, columns]}


def _iter_safetensors(path: Path) -> Iterator[tuple[str, Tensor]]:
    from safetensors import SafetensorError, safe_open

    for file in _safetensors_files(path):
        try:
            with safe_open(str(file), framework="pt") as f:
                types = json.loads((f.metadata() or {}).get(_GGUF_TYPES_KEY, "{}"))
                for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    if name in types:
                        qtype, cols = types[name]
                        raw = f.get_tensor(name).numpy()
                        yield name, GGUFWeight(raw, GGMLQuantizationType(qtype), cols)
                    else:
                        yield name, f.get_tensor(name)
        except (SafetensorError, OSError, RuntimeError) as e:
            raise CheckpointError(f"corrupt or unreadable weights file {file.name}: {e}") from e


# ---------------------------------------------------------------------------------------------- GGUF

_GGUF_ARCH = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
_GGUF_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


@functools.lru_cache(maxsize=2)
def _reader(path: Path):  # noqa: ANN202 (gguf has no type stubs)
    from gguf import GGUFReader

    try:
        return GGUFReader(str(path))
    except Exception as e:  # the reader raises ValueError, struct.error, IndexError, ... on bad bytes
        raise CheckpointError(f"corrupt or unreadable GGUF file {path.name}: {e}") from e


def _gguf_config(path: Path) -> dict[str, Any]:
    r = _reader(path)

    def get(key: str, default: Any = None) -> Any:
        field = r.fields.get(key)
        return default if field is None else field.contents()

    arch = get("general.architecture")
    if arch not in _GGUF_ARCH:
        raise CheckpointError(f"unsupported GGUF architecture {arch!r}; supported: {sorted(_GGUF_ARCH)}")
    heads = get(f"{arch}.attention.head_count")
    hidden = get(f"{arch}.embedding_length")
    names = {t.name for t in r.tensors}
    tokens = r.fields.get("tokenizer.ggml.tokens")
    vocab = get(f"{arch}.vocab_size") or (len(tokens.data) if tokens is not None else None)
    cfg: dict[str, Any] = {
        "architectures": [_GGUF_ARCH[arch]],
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": get(f"{arch}.feed_forward_length"),
        "num_hidden_layers": get(f"{arch}.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": get(f"{arch}.attention.head_count_kv", heads),
        "head_dim": get(f"{arch}.attention.key_length", hidden // heads),
        "rms_norm_eps": get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": get(f"{arch}.rope.freq_base", 10000.0),
        "max_position_embeddings": get(f"{arch}.context_length", 4096),
        "tie_word_embeddings": "output.weight" not in names,
        "eos_token_id": get("tokenizer.ggml.eos_token_id"),
        "bos_token_id": get("tokenizer.ggml.bos_token_id"),
        "attention_bias": "blk.0.attn_q.bias" in names,
        "gguf_arch": arch,
    }
    scaling = get(f"{arch}.rope.scaling.type")
    if scaling and scaling != "none":
        cfg["rope_scaling"] = {
            "rope_type": scaling,
            "factor": get(f"{arch}.rope.scaling.factor"),
            "original_max_position_embeddings": get(f"{arch}.rope.scaling.original_context_length"),
        }
    missing = [k for k, v in cfg.items() if v is None and k not in ("bos_token_id", "eos_token_id")]
    if missing:
        raise CheckpointError(f"GGUF file {path.name} lacks metadata for {missing}")
    return cfg


def _unpermute(w: Tensor, heads: int) -> Tensor:
    """Undo llama.cpp's interleaving of rotary halves in q/k rows (convert_hf_to_gguf permutes llama q/k)."""
    if isinstance(w, GGUFWeight):
        return w.permute_rows(heads)
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _gguf_tensor(t: Any, path: Path, native: bool) -> Tensor:  # noqa: ANN401 (gguf's ReaderTensor)
    from gguf.quants import dequantize

    if native and t.tensor_type in KERNEL_TYPES and len(t.shape) == 2:
        return GGUFWeight(np.asarray(t.data), t.tensor_type, int(t.shape[0]))
    try:
        arr = dequantize(t.data, t.tensor_type)
    except Exception as e:
        raise CheckpointError(f"cannot dequantize tensor {t.name} of {path.name}: {e}") from e
    return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32).copy())


def _iter_gguf(path: Path, cfg: dict[str, Any], native: bool = False) -> Iterator[tuple[str, Tensor]]:
    r = _reader(path)
    permute = cfg.get("gguf_arch") in ("llama", "mistral")
    for t in r.tensors:
        w = _gguf_tensor(t, path, native)
        if t.name == "token_embd.weight":
            yield "model.embed_tokens.weight", w
        elif t.name == "output_norm.weight":
            yield "model.norm.weight", w
        elif t.name == "output.weight":
            yield "lm_head.weight", w
        elif t.name.startswith("blk."):
            _, layer, kind, suffix = t.name.split(".", 3)
            if kind not in _GGUF_NAMES:
                raise CheckpointError(f"unexpected tensor {t.name} in {path.name}")
            if permute and kind == "attn_q":
                w = _unpermute(w, cfg["num_attention_heads"])
            elif permute and kind == "attn_k":
                w = _unpermute(w, cfg["num_key_value_heads"])
            yield f"model.layers.{layer}.{_GGUF_NAMES[kind]}.{suffix}", w
        elif t.name != "rope_freqs.weight":
            raise CheckpointError(f"unexpected tensor {t.name} in {path.name}")


def gguf_as_hf_dir(path: Path, cache_root: Path, native: bool = False) -> Path | None:
    """Convert a GGUF file once into an HF-style directory (config.json + model.safetensors) under the cache.

    Parsing a GGUF's vocabulary and dequantizing takes ~12 s on two cores; loading the cached fp32
    safetensors takes ~1 s, which matters for a pod or a test suite that starts the server many times.
    `native`: the tensors Skiff computes on stay blocks (uint8, their types in the file's metadata).
    Returns None when the cache cannot be written.
    """
    from safetensors.torch import save_file

    st = path.stat()
    key = f"{path.stem}-{st.st_size}-{int(st.st_mtime)}" + ("-blocks" if native else "")
    out = cache_root / "gguf" / key
    if (out / "model.safetensors").is_file() and (out / "config.json").is_file():
        return out
    cfg = _gguf_config(path)
    tmp = out.with_name(f"{key}.tmp{os.getpid()}")
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        tensors, types = {}, {}
        for name, w in _iter_gguf(path, cfg, native=native):
            if isinstance(w, GGUFWeight):
                types[name] = [int(w.qtype), w.cols]
                w = torch.from_numpy(np.require(w.raw, requirements=["C", "W"]))
            tensors[name] = w
        save_file(tensors, str(tmp / "model.safetensors"), metadata={_GGUF_TYPES_KEY: json.dumps(types)})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
        os.replace(tmp, out)
    except OSError:  # a read-only cache, or another process renamed its copy into place first
        shutil.rmtree(tmp, ignore_errors=True)
        complete = (out / "model.safetensors").is_file() and (out / "config.json").is_file()
        return out if complete else None
    return out
