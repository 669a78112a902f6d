"""`skiff download SOURCE [--dest DIR]`: fetch (hf://) or check (pvc://, file://) a model."""

from __future__ import annotations

import argparse
import sys

from skiff.download import DEFAULT_EXCLUDE, DownloadError, fetch, write_termination_message


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="hf://org/name[@revision], pvc://claim/path or file:///path")
    parser.add_argument("--dest", help="target directory (hf://) or the claim's mount point (pvc://)")
    parser.add_argument(
        "--exclude",
        action="append",
        default=None,
        help=f"glob of repository files to skip (repeatable; default: {' '.join(DEFAULT_EXCLUDE)})",
    )


def run(args: argparse.Namespace) -> int:
    exclude = tuple(args.exclude) if args.exclude is not None else DEFAULT_EXCLUDE
    try:
        message = fetch(args.source, args.dest, exclude=exclude)
    except DownloadError as e:
        text = f"skiff download: error: {e}"
        print(text, file=sys.stderr, flush=True)
        write_termination_message(text)
        return 1
    print(f"skiff download: ok: {message}", flush=True)
    return 0
