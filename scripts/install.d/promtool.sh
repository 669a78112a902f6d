#!/usr/bin/env bash
# promtool for the chart's alert-rule tests (tests/delivery/test_observability.py: `promtool check rules`
# and `promtool test rules`), from Debian's `prometheus` package. Root only (apt); elsewhere the tests skip
# with a message saying so. Only the tool is wanted: the package's Prometheus service is stopped and
# disabled where systemd runs it.
set -euo pipefail
command -v promtool >/dev/null 2>&1 && exit 0
[[ $(id -u) -eq 0 ]] || { echo "install.d/promtool.sh: not root, promtool not installed"; exit 0; }
apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
if [[ -d /run/systemd/system ]]; then
  systemctl disable --now prometheus.service >/dev/null 2>&1 || true
fi
