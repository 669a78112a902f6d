#!/usr/bin/env bash
# promtool and the Prometheus server for the chart's observability tests, from Debian's `prometheus`
# package: tests/delivery/test_observability.py runs `promtool check rules` and `promtool test rules`,
# tests/delivery/test_prometheus_live.py starts its own `prometheus` on 127.0.0.1. Root only (apt);
# elsewhere the tests skip with a message saying so. The package's own Prometheus service is not wanted:
# it is stopped and disabled where systemd runs it.
set -euo pipefail
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 && exit 0
[[ $(id -u) -eq 0 ]] || { echo "install.d/promtool.sh: not root, promtool not installed"; exit 0; }
apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
if [[ -d /run/systemd/system ]]; then
  systemctl disable --now prometheus.service >/dev/null 2>&1 || true
fi
