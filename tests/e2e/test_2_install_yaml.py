"""The same user story once more without Helm: `kubectl apply --server-side` of manifests/crds/ and
manifests/install.yaml (the README's commands), an InferenceService on the CPU image, a chat completion
through the router's Service, then delete everything."""

from __future__ import annotations

import time

import yaml
from e2e_helpers import chat, example, wait_until
from support.kube import strip_for_old_servers
from support.paths import ROOT

NS = "models-plain"
CPU_IMAGE = "localhost/skiff:0.1.0-cpu"


def _local(text: str) -> str:
    """The shipped manifests with the locally built images (no registry here)."""
    return text.replace("skiff-project/", "localhost/")


def _for_old_servers(text: str) -> str:
    docs = [d for d in yaml.safe_load_all(text) if d]
    for d in docs:
        if d["kind"] == "CustomResourceDefinition":
            strip_for_old_servers(d)
    return yaml.safe_dump_all(docs)


def test_install_yaml_serves_the_embedded_model(cluster, tmp_path):
    # A fresh cluster: the CRD kept by the Helm test's uninstall goes first.
    cluster.kubectl("delete", "crd", "inferenceservices.skiff.dev", "--ignore-not-found", "--timeout=120s")
    crds = tmp_path / "crds"
    crds.mkdir()
    for f in sorted((ROOT / "manifests" / "crds").glob("*.yaml")):
        (crds / f.name).write_text(_for_old_servers(f.read_text()))
    install = tmp_path / "install.yaml"
    install.write_text(_for_old_servers(_local((ROOT / "manifests" / "install.yaml").read_text())))

    t0 = time.monotonic()
    cluster.kubectl("apply", "--server-side", "-f", str(crds))
    cluster.kubectl("wait", "--for=condition=Established", "crd/inferenceservices.skiff.dev", "--timeout=60s")
    cluster.kubectl("apply", "--server-side", "-f", str(install))
    cluster.kubectl(
        "wait",
        "-n",
        "skiff-system",
        "--for=condition=Available",
        "deployment/skiff-operator",
        "deployment/skiff-router",
        "--timeout=180s",
    )
    cluster.kubectl("create", "namespace", NS)
    isvc = example("embedded-cpu.yaml")
    isvc["spec"]["resources"]["cpu"] = "500m"
    isvc["spec"]["runtime"]["image"] = CPU_IMAGE
    cluster.apply(isvc, NS)
    cluster.kubectl(
        "wait", "-n", NS, "--for=condition=Ready", "inferenceservice/smollm2", "--timeout=300s", timeout=320
    )
    cluster.report["install_yaml_apply_to_ready_seconds"] = round(time.monotonic() - t0, 1)
    router = cluster.service_url("skiff-system", "skiff-router")
    answer = wait_until("an answer through the router", lambda: chat(router, "Say hello."), timeout=60)
    assert answer.strip()

    cluster.kubectl("delete", "-n", NS, "inferenceservice/smollm2", "--timeout=120s")
    wait_until("the pods gone", lambda: not cluster.get("pods", "-n", NS)["items"], timeout=120)
    cluster.kubectl("delete", "--ignore-not-found", "-f", str(install), "--timeout=180s", timeout=200)
    cluster.kubectl("delete", "namespace", NS, "--timeout=120s")
