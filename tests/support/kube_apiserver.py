"""A real Kubernetes control plane for tests: etcd + kube-apiserver + kube-controller-manager (1.20.2, built
by scripts/install.d/kube.sh) on 127.0.0.1, static-token auth, RBAC. There is no scheduler and no kubelet:
support.kubelet.FakeKubelet plays the node."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import httpx
import yaml

from support.ports import free_port
from support.process import Process, stop_all
from support.waiting import file_tail, wait_for

KUBE_CACHE = Path(os.environ.get("SKIFF_KUBE_CACHE", Path.home() / ".cache" / "skiff-kube"))
KUBE_BIN = KUBE_CACHE / "bin"
TOKEN = "skiff-test-admin-token"


def binaries_present() -> bool:
    return all((KUBE_BIN / b).exists() for b in ("etcd", "kube-apiserver", "kube-controller-manager"))


def kubeconfig_yaml(server: str, token: str) -> str:
    """A kubeconfig of one cluster (TLS unverified: the test server's own certificate) and one token user."""
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
            "users": [{"name": "user", "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "user"}}],
        }
    )


class ControlPlane:
    def __init__(self) -> None:
        base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        self.dir = Path(tempfile.mkdtemp(prefix="skiff-kube-", dir=base))
        self.procs: list[Process] = []
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.kubeconfig = self.dir / "kubeconfig"

    def _spawn(self, name: str, argv: list[str]) -> None:
        self.procs.append(Process(argv, log_path=self.dir / f"{name}.log", new_session=True, name=name))

    def log_tail(self, name: str, lines: int = 30) -> str:
        return file_tail(self.dir / f"{name}.log", lines)

    def start(self, timeout: float = 90.0) -> None:
        d = self.dir
        subprocess.run(
            ["openssl", "genrsa", "-out", str(d / "sa.key"), "2048"], check=True, capture_output=True
        )
        subprocess.run(
            ["openssl", "rsa", "-in", str(d / "sa.key"), "-pubout", "-out", str(d / "sa.pub")],
            check=True,
            capture_output=True,
        )
        (d / "tokens.csv").write_text(f"{TOKEN},admin,admin,system:masters\n")
        etcd_port, peer_port = free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        self._spawn(
            "etcd",
            [
                str(KUBE_BIN / "etcd"),
                "--name",
                "skiff-test",
                "--data-dir",
                str(d / "etcd"),
                "--listen-client-urls",
                etcd_url,
                "--advertise-client-urls",
                etcd_url,
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-cluster",
                f"skiff-test=http://127.0.0.1:{peer_port}",
                "--listen-metrics-urls",
                f"http://127.0.0.1:{free_port()}",
            ],
        )
        self._spawn(
            "kube-apiserver",
            [
                str(KUBE_BIN / "kube-apiserver"),
                "--etcd-servers",
                etcd_url,
                "--bind-address",
                "127.0.0.1",
                "--advertise-address",
                "127.0.0.1",
                "--secure-port",
                str(self.port),
                "--insecure-port",
                "0",
                "--cert-dir",
                str(d / "certs"),
                "--token-auth-file",
                str(d / "tokens.csv"),
                "--authorization-mode",
                "RBAC",
                "--service-account-key-file",
                str(d / "sa.pub"),
                "--service-account-signing-key-file",
                str(d / "sa.key"),
                "--service-account-issuer",
                "https://kubernetes.default.svc.cluster.local",
                "--api-audiences",
                "https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range",
                "10.96.0.0/16",
                "--disable-admission-plugins",
                "ServiceAccount",
                "--enable-priority-and-fairness=false",
            ],
        )
        self.kubeconfig.write_text(kubeconfig_yaml(self.url, TOKEN))
        self._wait_ready(timeout)
        self._spawn(
            "kube-controller-manager",
            [
                str(KUBE_BIN / "kube-controller-manager"),
                "--kubeconfig",
                str(self.kubeconfig),
                "--port",
                "0",
                "--secure-port",
                "0",
                "--leader-elect=false",
                "--controllers",
                "deployment,replicaset,garbagecollector,endpoint,endpointslice,namespace,disruption",
                "--service-account-private-key-file",
                str(d / "sa.key"),
                "--use-service-account-credentials=false",
                "--concurrent-gc-syncs",
                "5",
            ],
        )

    def _wait_ready(self, timeout: float) -> None:
        def ready() -> bool:
            for proc in self.procs:
                if not proc.running:
                    raise RuntimeError(
                        f"{proc.name} exited {proc.proc.returncode}:\n{self.log_tail('kube-apiserver')}"
                        f"\n{self.log_tail('etcd')}"
                    )
            headers = {"Authorization": f"Bearer {TOKEN}"}
            return (
                httpx.get(f"{self.url}/readyz", headers=headers, verify=False, timeout=2).status_code == 200
            )

        log = self.dir / "kube-apiserver.log"
        wait_for(ready, timeout, "kube-apiserver /readyz", interval=0.3, tolerate=(httpx.HTTPError,), log=log)

    def stop(self) -> None:
        stop_all(self.procs[::-1], grace=10)
        shutil.rmtree(self.dir, ignore_errors=True)
