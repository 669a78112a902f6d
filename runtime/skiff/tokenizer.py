"""Tokenizer loading: an HF directory's own tokenizer, or one converted from a GGUF file's metadata.

Converting a GGUF vocabulary takes transformers ~15 s, so the converted tokenizer is saved once under the
cache directory (keyed by the file's size and mtime) and loaded from there afterwards.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase


def cache_dir() -> Path:
    root = os.environ.get("SKIFF_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "skiff")
    return Path(root)


def _gguf_cache_key(path: Path) -> str:
    st = path.stat()
    return hashlib.sha256(f"{path.resolve()}:{st.st_size}:{int(st.st_mtime)}".encode()).hexdigest()[:16]


def load_tokenizer(path: str | os.PathLike[str]) -> PreTrainedTokenizerBase:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"tokenizer path does not exist: {p}")
    if p.is_file() and p.suffix == ".gguf":
        cached = cache_dir() / "tokenizers" / _gguf_cache_key(p)
        if (cached / "tokenizer_config.json").is_file():
            return AutoTokenizer.from_pretrained(str(cached))
        tok = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
        try:
            tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
            tok.save_pretrained(str(tmp))
            os.replace(tmp, cached)
        except OSError:  # a read-only cache (the conversion again next time), or another process was first
            shutil.rmtree(tmp, ignore_errors=True)
        return tok
    return AutoTokenizer.from_pretrained(str(p))
