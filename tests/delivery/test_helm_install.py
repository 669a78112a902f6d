"""`helm install` of the chart (helm-python-sdk) into a real kube-apiserver (the operator tests' control
plane, built by scripts/install.d/kube.sh), then the operator, run with the installed Deployment's own
command line and the installed ServiceAccount's token (so the chart's RBAC is what it gets), reconciles an
example InferenceService to Ready, and the router (likewise) lists it as ready on /v1/models; `helm
uninstall` keeps the CRD and the InferenceService.

The test API server is Kubernetes 1.20 and reports version v0.0.0, while the chart claims >= 1.29. So the
unmodified chart must be refused on its kubeVersion, and the installed copy drops what 1.20 cannot hold:
the kubeVersion line, the CRD's CEL rules, and empty-string defaults (1.20 stores them as null)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
import yaml
from support.kube import (
    NO_KUBE,
    Api,
    chart_for_test_server,
    connect,
    control_plane,
    crd_established,
    missing_as_none,
)
from support.kube_apiserver import ControlPlane, binaries_present, kubeconfig_yaml
from support.kubelet import FakeKubelet
from support.paths import CHART, EXAMPLES
from support.ports import free_port
from support.process import Process, stop_all
from support.waiting import wait_for

pytestmark = pytest.mark.skipif(not binaries_present(), reason=NO_KUBE)

RELEASE, NAMESPACE, MODELS_NS = "skiff", "skiff-system", "models"


def wait_long(what: str, check, timeout: float = 60.0, log: Path | None = None):
    """Cluster-side work (controllers, the operator, helm hooks) takes seconds: poll every half second."""
    return wait_for(check, timeout, what, interval=0.5, log=log)


@pytest.fixture(scope="module")
def cluster():
    with control_plane() as cp:
        yield cp


@pytest.fixture(scope="module")
def clients(cluster: ControlPlane) -> Api:
    return connect(cluster.kubeconfig)


def test_unmodified_chart_is_refused_on_kube_version(cluster):
    import helm_python as helm

    with (
        helm.Config(kubeconfig_path=str(cluster.kubeconfig), namespace=NAMESPACE) as cfg,
        pytest.raises(helm.HelmReleaseError, match=r"chart requires kubeVersion: >=1\.29"),
    ):
        cfg.install(str(CHART), "refused", {}, namespace=NAMESPACE, create_namespace=True)


@contextlib.contextmanager
def installed_operator(cluster, clients, tmp_path: Path, health: int, replicas: int = 1):
    """Runs the installed operator Deployment's container as local processes, one per replica: its command
    line (after the kubelet's $(VAR) expansion; each replica its own health and metrics ports, as in its
    own pod) and its ServiceAccount's token. Yields the log paths."""
    operator = clients.apps.read_namespaced_deployment("skiff-operator", NAMESPACE)
    container = operator.spec.template.spec.containers[0]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env["KUBECONFIG"] = str(service_account_kubeconfig(cluster, clients, operator, tmp_path))
    command = [a.replace("$$", "$") for a in container.command]
    kubelet = FakeKubelet(clients.core, MODELS_NS)
    kubelet.start()
    procs: list[Process] = []
    logs: list[Path] = []
    try:
        for i in range(replicas):
            port = health if i == 0 else free_port()
            ports = {"--health-port=": port, "--metrics-port=": free_port()}  # each pod has its own
            args = [next((f"{p}{n}" for p, n in ports.items() if a.startswith(p)), a) for a in container.args]
            logs.append(tmp_path / f"operator-{i}.log")
            pod_env = {**env, "POD_ID": f"replica-{i}"}  # the Deployment's downward-API pod name
            assert any(
                e.name == "POD_ID" and e.value_from.field_ref.field_path == "metadata.name"
                for e in container.env
            )
            procs.append(Process([*command, *args], env=pod_env, log_path=logs[-1], new_session=True))
            procs[-1].wait_http_ok(f"http://127.0.0.1:{port}/healthz", 60, interval=0.5)
        yield logs
        for proc in procs:
            assert proc.running, proc.log(3000)
            assert "Forbidden" not in proc.log(None), proc.log(3000)
    finally:
        stop_all(procs, grace=15)
        kubelet.stop()


def reconcile_example(clients, log: Path, name: str) -> dict:
    """Creates the embedded-CPU example as `name` and waits for its children and Ready."""
    example = yaml.safe_load((EXAMPLES / "embedded-cpu.yaml").read_text())
    example["metadata"]["name"] = name
    clients.custom.create_namespaced_custom_object(
        "skiff.dev", "v1alpha1", MODELS_NS, "inferenceservices", example
    )
    dep = wait_long(
        "the model Deployment",
        lambda: missing_as_none(lambda: clients.apps.read_namespaced_deployment(name, MODELS_NS)),
        log=log,
    )
    owner = dep.metadata.owner_references[0]
    assert (owner.kind, owner.name, owner.controller) == ("InferenceService", name, True)
    assert dep.spec.template.spec.containers[0].image == "skiff-project/skiff:0.1.0"
    wait_long(
        "the model Service",
        lambda: missing_as_none(lambda: clients.core.read_namespaced_service(name, MODELS_NS)),
        log=log,
    )
    isvc = wait_long("the InferenceService to be Ready", lambda: _ready(clients, name), timeout=90, log=log)
    assert isvc["status"]["readyReplicas"] == 1
    # with the router: an internal key and a NetworkPolicy, written under the chart's RBAC
    secret = clients.core.read_namespaced_secret(f"{name}-internal-key", MODELS_NS)
    assert secret.metadata.labels["skiff.dev/internal-key"] == name
    import kubernetes

    kubernetes.client.NetworkingV1Api(clients.client).read_namespaced_network_policy(name, MODELS_NS)
    return isvc


def test_install_then_operator_reconciles_an_example(cluster, clients, tmp_path):
    import helm_python as helm

    chart = chart_for_test_server(tmp_path)
    health = free_port()
    with helm.Config(kubeconfig_path=str(cluster.kubeconfig), namespace=NAMESPACE) as cfg:
        release = cfg.install(
            str(chart),
            RELEASE,
            {"operator": {"healthPort": health}},
            namespace=NAMESPACE,
            create_namespace=True,
            timeout=120,
        )
        assert release["status"] == "deployed", release
        ext = clients.ext
        wait_long("the CRD to be established", lambda: crd_established(ext, "inferenceservices.skiff.dev"))
        crd = ext.read_custom_resource_definition("inferenceservices.skiff.dev")
        assert crd.metadata.annotations["helm.sh/resource-policy"] == "keep"
        clients.apps.read_namespaced_deployment("skiff-router", NAMESPACE)
        # The API server's own RBAC authorizer: the router's ServiceAccount may make its calls, and no more.
        router_sa = f"system:serviceaccount:{NAMESPACE}:skiff-router"
        for verb, group, resource in [
            ("list", "skiff.dev", "inferenceservices"),
            ("watch", "skiff.dev", "inferenceservices"),
            ("list", "discovery.k8s.io", "endpointslices"),
            ("get", "", "secrets"),
            ("list", "", "services"),
            ("patch", "skiff.dev", "inferenceservices/scale"),
        ]:
            assert can(clients, router_sa, verb, group, resource), (verb, group, resource)
        for verb, group, resource in [
            ("create", "", "secrets"),
            ("list", "", "secrets"),  # by name in model namespaces; listed only in its own (client keys)
            ("delete", "apps", "deployments"),
            ("patch", "skiff.dev", "inferenceservices"),
            ("create", "", "pods"),
        ]:
            assert not can(clients, router_sa, verb, group, resource), (verb, group, resource)
        clients.core.create_namespace({"metadata": {"name": MODELS_NS}})
        with installed_operator(cluster, clients, tmp_path, health) as (log,):
            reconcile_example(clients, log, "smollm2")
            schedule_pods(clients)
            models = run_installed_router(cluster, clients, tmp_path)
            assert models == {"smollm2-135m-instruct": 1}, models
        cfg.uninstall(RELEASE)
    assert (
        missing_as_none(lambda: clients.apps.read_namespaced_deployment("skiff-operator", NAMESPACE)) is None
    )
    ext.read_custom_resource_definition("inferenceservices.skiff.dev")  # kept
    clients.custom.get_namespaced_custom_object(
        "skiff.dev", "v1alpha1", MODELS_NS, "inferenceservices", "smollm2"
    )


def test_reinstall_namespaced_adopts_the_kept_crd(cluster, clients, tmp_path):
    """The documented path after an uninstall: the same release installs again and takes the kept CRD
    back; here with least-privilege RBAC (Roles in the watched namespace) and two operator replicas, of
    which the lower kopf priority stands by."""
    import helm_python as helm

    chart = chart_for_test_server(tmp_path)
    health = free_port()
    # Two replicas electing one active instance; no PDB (1.20 serves no policy/v1).
    values = {
        "operator": {
            "healthPort": health,
            "watchNamespaces": [MODELS_NS],
            "replicas": 2,
            "pdb": {"enabled": False},
        },
        "rbac": {"clusterWide": False},
    }
    with helm.Config(kubeconfig_path=str(cluster.kubeconfig), namespace=NAMESPACE) as cfg:
        if any(r["name"] == RELEASE for r in cfg.list()):
            cfg.uninstall(RELEASE)  # left over by a failed test above
        if missing_as_none(lambda: clients.core.read_namespace(MODELS_NS)) is None:
            clients.core.create_namespace({"metadata": {"name": MODELS_NS}})
        assert (
            cfg.install(str(chart), RELEASE, values, namespace=NAMESPACE, timeout=120)["status"] == "deployed"
        )
        rbac = kubernetes_rbac(clients)
        assert rbac.read_namespaced_role("skiff-operator", MODELS_NS)
        assert missing_as_none(lambda: rbac.read_cluster_role("skiff-operator")) is None
        crd = clients.ext.read_custom_resource_definition("inferenceservices.skiff.dev")
        assert crd.metadata.annotations["meta.helm.sh/release-name"] == RELEASE
        with installed_operator(cluster, clients, tmp_path, health, replicas=2) as logs:
            peering = wait_long("both replicas in the KopfPeering", lambda: _peers(clients), log=logs[1])
            assert sorted(peering) == ["replica-0", "replica-1"], peering
            prio = {int(k.rsplit("-", 1)[1]): v["priority"] for k, v in peering.items()}
            assert prio[0] != prio[1], peering  # drawn at random: equal priorities would pause both
            low, high = sorted(prio, key=prio.get)
            if low == 0:  # it ran alone at first; it stands by once it has seen the higher peer
                wait_long(
                    "the first replica to stand by",
                    lambda: "Pausing operations in favour of" in logs[0].read_text(errors="replace"),
                    timeout=30,
                    log=logs[0],
                )
            # (started second with the lower priority, a replica is paused from its start)
            reconcile_example(clients, logs[high], "smollm2-again")
        cfg.uninstall(RELEASE)


def schedule_pods(clients) -> None:
    """The scheduler's part, played: bind the model pods to a Node (the EndpointSlice controller skips
    pods without one)."""
    import kubernetes

    core = clients.core
    if missing_as_none(lambda: core.read_node("node-1")) is None:
        core.create_node({"metadata": {"name": "node-1"}})
    for pod in core.list_namespaced_pod(MODELS_NS, label_selector="skiff.dev/inferenceservice").items:
        if not pod.spec.node_name:
            core.create_namespaced_pod_binding(
                pod.metadata.name,
                MODELS_NS,
                kubernetes.client.V1Binding(
                    metadata=kubernetes.client.V1ObjectMeta(name=pod.metadata.name),
                    target=kubernetes.client.V1ObjectReference(kind="Node", name="node-1"),
                ),
                _preload_content=False,
            )


def run_installed_router(cluster, clients, tmp_path: Path) -> dict[str, int]:
    """Runs the installed router Deployment's container (its command line, its ServiceAccount's token; a free
    port on 127.0.0.1 instead of 0.0.0.0:8080) until /v1/models lists a ready model; returns id -> replicas."""
    import httpx

    dep = clients.apps.read_namespaced_deployment("skiff-router", NAMESPACE)
    c = dep.spec.template.spec.containers[0]
    port = free_port()
    args = [
        f"--port={port}" if a.startswith("--port=") else "--host=127.0.0.1" if a.startswith("--host=") else a
        for a in c.args
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env["KUBECONFIG"] = str(service_account_kubeconfig(cluster, clients, dep, tmp_path))
    # the Deployment's downward-API namespace: where the router's client keys and peers live
    assert any(
        e.name == "POD_NAMESPACE" and e.value_from.field_ref.field_path == "metadata.namespace" for e in c.env
    )
    env["POD_NAMESPACE"] = NAMESPACE
    log = tmp_path / "router.log"

    def ready_models() -> dict[str, int] | None:
        try:
            r = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5)
        except httpx.HTTPError:
            return None
        got = {m["id"]: m["ready_replicas"] for m in r.json()["data"]} if r.status_code == 200 else {}
        return got if got and all(got.values()) else None

    proc = Process([*c.command, *args], env=env, log_path=log, new_session=True)
    try:
        models = wait_long("the router to list a ready model", ready_models, timeout=60, log=log)
        text = proc.log(None)
        assert "Forbidden" not in text and "discovery failed" not in text, text[-3000:]
        return models
    finally:
        proc.stop(grace=15)


def can(clients, user: str, verb: str, group: str, resource: str, namespace: str = MODELS_NS) -> bool:
    """A SubjectAccessReview: the API server's RBAC decision for `user`."""
    import kubernetes

    res, _, sub = resource.partition("/")
    review = kubernetes.client.V1SubjectAccessReview(
        spec=kubernetes.client.V1SubjectAccessReviewSpec(
            user=user,
            groups=["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}", "system:authenticated"],
            resource_attributes=kubernetes.client.V1ResourceAttributes(
                verb=verb, group=group, resource=res, subresource=sub or None, namespace=namespace
            ),
        )
    )
    api = kubernetes.client.AuthorizationV1Api(clients.core.api_client)
    return bool(api.create_subject_access_review(review).status.allowed)


def kubernetes_rbac(clients):
    import kubernetes

    return kubernetes.client.RbacAuthorizationV1Api(clients.core.api_client)


def service_account_kubeconfig(cluster, clients, deployment, tmp_path: Path) -> Path:
    """A kubeconfig with the Deployment's ServiceAccount token (TokenRequest API): the chart's RBAC only."""
    import kubernetes

    sa = deployment.spec.template.spec.service_account_name
    token = clients.core.create_namespaced_service_account_token(
        sa,
        NAMESPACE,
        kubernetes.client.AuthenticationV1TokenRequest(
            spec=kubernetes.client.V1TokenRequestSpec(
                audiences=["https://kubernetes.default.svc.cluster.local"], expiration_seconds=3600
            )
        ),
    ).status.token
    path = tmp_path / f"{sa}.kubeconfig"
    path.write_text(kubeconfig_yaml(cluster.url, token))
    return path


def _peers(clients) -> dict | None:
    obj = clients.custom.get_namespaced_custom_object(
        "kopf.dev", "v1", MODELS_NS, "kopfpeerings", "skiff-operator"
    )
    peers = obj.get("status") or {}
    return peers if len(peers) == 2 else None


def _ready(clients, name: str) -> dict | None:
    isvc = clients.custom.get_namespaced_custom_object(
        "skiff.dev", "v1alpha1", MODELS_NS, "inferenceservices", name
    )
    conds = (isvc.get("status") or {}).get("conditions") or []
    return isvc if any(c["type"] == "Ready" and c["status"] == "True" for c in conds) else None
