"""Where things are in the checkout."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "skiff"
EXAMPLES = ROOT / "manifests" / "examples"
