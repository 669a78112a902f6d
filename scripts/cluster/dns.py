"""The local test cluster's DNS (the part of CoreDNS a cluster's pods need): A records for Services,
`<service>.<namespace>.svc.<domain>`, read from the API server once a second. Other names get NXDOMAIN:
the test node has no upstream resolver to forward to.

    python3 dns.py --kubeconfig FILE --listen 10.254.254.1 [--port 53] [--domain cluster.local]
"""

from __future__ import annotations

import argparse
import logging
import threading
import time

import kubernetes
from dnslib import QTYPE, RCODE, RR, A
from dnslib.server import BaseResolver, DNSServer

log = logging.getLogger("skiff-cluster-dns")


class ServiceResolver(BaseResolver):
    def __init__(self, domain: str) -> None:
        self.domain = domain.strip(".")
        self.records: dict[str, str] = {}

    def refresh(self, core: kubernetes.client.CoreV1Api) -> None:
        records = {}
        for svc in core.list_service_for_all_namespaces().items:
            ip = svc.spec.cluster_ip
            if ip and ip != "None":
                records[f"{svc.metadata.name}.{svc.metadata.namespace}.svc.{self.domain}"] = ip
        self.records = records

    def resolve(self, request, handler):  # dnslib's resolver interface
        reply = request.reply()
        name = str(request.q.qname).rstrip(".").lower()
        ip = self.records.get(name)
        if ip is None:
            reply.header.rcode = RCODE.NXDOMAIN
        elif request.q.qtype in (QTYPE.A, QTYPE.ANY):
            reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(ip), ttl=5))
        return reply  # an AAAA question for a known name: NOERROR with no answer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--listen", required=True)
    ap.add_argument("--port", type=int, default=53)
    ap.add_argument("--domain", default="cluster.local")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO)
    core = kubernetes.client.CoreV1Api(kubernetes.config.new_client_from_config(args.kubeconfig))
    resolver = ServiceResolver(args.domain)

    def poll() -> None:
        while True:
            try:
                resolver.refresh(core)
            except Exception as e:  # the API server restarting: keep the last records
                log.warning("refresh failed: %s", e)
            time.sleep(1)

    threading.Thread(target=poll, daemon=True).start()
    servers = [DNSServer(resolver, address=args.listen, port=args.port, tcp=tcp) for tcp in (False, True)]
    for s in servers:
        s.start_thread()
    log.info("serving %s on %s:%d", args.domain, args.listen, args.port)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
