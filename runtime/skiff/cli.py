"""`skiff` console script: each subcommand lives in skiff.commands.<name> with add_parser() and run()."""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import importlib.util
import signal
import sys

# name -> module under skiff.commands; each module defines add_arguments(parser) and run(args) -> int
COMMANDS: dict[str, str] = {
    "serve": "serve",
    "generate": "generate",
    "bench": "bench",
    "download": "download",
}
HELP: dict[str, str] = {
    "serve": "serve a model over an OpenAI-compatible HTTP API",
    "generate": "generate offline from prompts on the command line",
    "bench": "benchmarks: `offline` (in-process engine) or `serve` (load generator for any OpenAI server)",
    "download": "download a model (hf://org/name[@rev]) into a local directory",
}


def main(argv: list[str] | None = None) -> int:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID` prints every thread's stack
    parser = argparse.ArgumentParser(prog="skiff", description="Skiff LLM serving")
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    missing: dict[str, str] = {}
    for name, module in COMMANDS.items():
        try:
            mod = importlib.import_module(f"skiff.commands.{module}")
        except ModuleNotFoundError as e:
            if e.name == f"skiff.commands.{module}":
                continue
            # A slim install (the operator image) lacks the model stack: the command stays listed and says so.
            missing[name] = str(e.name)
            sub.add_parser(
                name, help=HELP[name] + " (needs skiff[runtime])", description=HELP[name], add_help=False
            )
            continue
        # The serve parent process imports no torch itself (its children do): check the install up front.
        lacking = [dep for dep in getattr(mod, "REQUIRES", ()) if importlib.util.find_spec(dep) is None]
        if lacking:
            missing[name] = lacking[0]
            sub.add_parser(
                name, help=HELP[name] + " (needs skiff[runtime])", description=HELP[name], add_help=False
            )
            continue
        modules[name] = mod
        mod.add_arguments(sub.add_parser(name, help=HELP[name], description=HELP[name]))
    args, unknown = parser.parse_known_args(argv)
    if unknown and args.command not in missing:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command in missing:
        print(
            f"skiff {args.command}: this install lacks {missing[args.command]!r}; "
            "install the runtime extra: pip install 'skiff[runtime]' (and torch)",
            file=sys.stderr,
        )
        return 2
    return int(modules[args.command].run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
