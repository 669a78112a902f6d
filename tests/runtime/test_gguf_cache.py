"""The dequantized-GGUF cache when two processes convert the same file at once."""

from __future__ import annotations

import os

import torch
from skiff.loader import checkpoint


def test_losing_a_conversion_race_leaves_no_temporary_copy(tmp_path, monkeypatch, embedded_path) -> None:
    monkeypatch.setattr(
        checkpoint, "_iter_gguf", lambda path, cfg, native=False: iter([("w", torch.zeros(2))])
    )
    real_replace = os.replace

    def other_process_first(src, dst):
        os.makedirs(dst)
        for name in ("model.safetensors", "config.json"):
            with open(os.path.join(dst, name), "w"):
                pass
        real_replace(src, dst)  # the target exists and is not empty: raises like the real race

    monkeypatch.setattr(checkpoint.os, "replace", other_process_first)
    out = checkpoint.gguf_as_hf_dir(embedded_path, tmp_path)
    assert out == tmp_path / "gguf" / out.name and (out / "config.json").is_file()
    assert [p.name for p in (tmp_path / "gguf").iterdir()] == [out.name], "a .tmp copy was left behind"
