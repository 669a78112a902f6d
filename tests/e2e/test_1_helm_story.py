"""The user story on a real single-node cluster, as a user meets Skiff: `helm install` of the chart with the
locally built images, an InferenceService applied with kubectl, chat completions through the router's
Service, scaling, a rollout under load, a crashed server, scale to zero and back, delete and uninstall.
The tests run in file order and build on each other (one cluster, one release)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import e2e_security
import httpx
import pytest
from e2e_helpers import MODEL, StreamLoad, chat, condition, example, is_ready, pod_counters, wait_until
from support.kube import chart_for_test_server  # the chart minus what 1.20 lacks
from support.ports import free_port
from support.process import Process

RELEASE, SYSTEM_NS, NS = "skiff", "skiff-system", "models"
VERSION = "0.1.0"
SELECTOR = "skiff.dev/inferenceservice=smollm2"
# The node has 2 cores; the example asks for 2 per pod, so two replicas and a surge pod would not fit.
POD_CPU = "500m"
PROMPT = "What is the capital of France? Answer in one sentence."


def embedded_service() -> dict:
    isvc = example("embedded-cpu.yaml")
    isvc["spec"]["resources"]["cpu"] = POD_CPU
    return isvc


@pytest.fixture(scope="module")
def helm_config(cluster):
    import helm_python as helm

    with helm.Config(kubeconfig_path=cluster.kubeconfig, namespace=SYSTEM_NS) as cfg:
        yield cfg


@pytest.fixture(scope="module")
def router_url(cluster, helm_config, tmp_path_factory) -> str:
    chart = chart_for_test_server(tmp_path_factory.mktemp("chart"))
    values = {
        "image": {"repository": "localhost/skiff-operator", "tag": VERSION, "pullPolicy": "Never"},
        "runtime": {"image": {"repository": "localhost/skiff", "tag": f"{VERSION}-cpu"}},
    }
    t0 = time.monotonic()
    release = helm_config.install(
        str(chart), RELEASE, values, namespace=SYSTEM_NS, create_namespace=True, timeout=180, wait="watcher"
    )
    assert release["status"] == "deployed"
    cluster.report["helm_install_to_available_seconds"] = round(time.monotonic() - t0, 1)
    cluster.kubectl("create", "namespace", NS)
    return cluster.service_url(SYSTEM_NS, "skiff-router")


def test_helm_install_operator_and_router_available(cluster, helm_config, router_url):
    out = cluster.kubectl(
        "wait",
        "-n",
        SYSTEM_NS,
        "--for=condition=Available",
        "deployment/skiff-operator",
        "deployment/skiff-router",
        "--timeout=120s",
    )
    assert out.count("condition met") == 2, out
    pods = cluster.get("pods", "-n", SYSTEM_NS)["items"]
    images = {c["image"] for p in pods for c in p["spec"]["containers"]}
    assert images == {f"localhost/skiff-operator:{VERSION}"}, images
    result = helm_config.test(RELEASE, timeout=120, logs=True)
    assert result["release"]["status"] == "deployed"
    assert "models: []" in result["logs"], result["logs"]
    # The README's way in from a workstation: kubectl port-forward to the router's Service.
    port = free_port()
    forward = Process(
        [
            "kubectl",
            "--kubeconfig",
            cluster.kubeconfig,
            "-n",
            SYSTEM_NS,
            "port-forward",
            "svc/skiff-router",
            f"{port}:80",
        ]
    )
    try:
        models = wait_until(
            "the port-forward",
            lambda: httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json(),
            timeout=30,
        )
        assert models["object"] == "list", models
    finally:
        forward.stop(grace=10)


def _phase_and_pods(cluster) -> tuple[str | None, list[dict]]:
    isvc = cluster.get("inferenceservice", "-n", NS, "smollm2")
    pods = cluster.get("pods", "-n", NS, "-l", SELECTOR)["items"]
    return isvc.get("status", {}).get("phase"), pods


def test_embedded_cpu_becomes_ready_and_answers_like_skiff_serve(cluster, router_url, tmp_path):
    t0 = time.monotonic()
    cluster.apply(embedded_service(), NS)
    seen: list[str] = []
    while time.monotonic() - t0 < 300:
        phase, pods = _phase_and_pods(cluster)
        if phase and (not seen or seen[-1] != phase):
            seen.append(phase)
            # The phase follows the real pod: Loading while a pod runs but is not Ready, Ready once it is.
            if phase == "Loading":
                assert pods and not any(is_ready(p) for p in pods), pods
            if phase == "Ready":
                assert any(is_ready(p) for p in pods)
                break
        time.sleep(0.25)
    assert seen and seen[-1] == "Ready", seen
    assert "Loading" in seen and seen[0] in ("Pending", "Loading"), seen
    cluster.report["apply_to_ready_seconds"] = round(time.monotonic() - t0, 1)
    cluster.report["phases_seen"] = seen
    cluster.kubectl("wait", "-n", NS, "--for=condition=Ready", "inferenceservice/smollm2", "--timeout=10s")

    table = cluster.kubectl("get", "inferenceservices", "-n", NS).splitlines()
    assert table[0].split() == ["NAME", "MODEL", "TP", "READY", "REPLICAS", "AVAILABLE", "URL", "AGE"], table
    row = table[1].split()
    assert row[:6] == ["smollm2", MODEL, "1", "True", "1", "1"], row
    assert row[6] == f"http://smollm2.{NS}.svc.cluster.local/v1", row

    answer = wait_until("the router to route the model", lambda: chat(router_url, PROMPT), timeout=60)
    assert answer == _local_skiff_serve_answer(cluster, tmp_path), answer


def test_only_the_router_reaches_the_model(cluster, router_url):
    """Direct calls to the model's Service and pods get 401; a team key through the router 200."""
    e2e_security.only_the_router_gets_in(cluster, router_url, NS, SELECTOR)


def test_rotating_the_internal_key_fails_no_request(cluster, router_url):
    e2e_security.rotation_keeps_serving(cluster, router_url, NS, SELECTOR)


def test_a_user_provided_key_still_works(cluster, router_url):
    e2e_security.user_key_still_works(cluster, router_url, NS, POD_CPU)


def _local_skiff_serve_answer(cluster, tmp_path: Path) -> str:
    """`skiff serve` on this machine with the pod's own command line (host and port aside)."""
    deploy = cluster.get("deployment", "-n", NS, "smollm2")
    cmd = list(deploy["spec"]["template"]["spec"]["containers"][0]["command"])
    port = free_port()
    cmd[cmd.index("--host") + 1], cmd[cmd.index("--port") + 1] = "127.0.0.1", str(port)
    cmd[cmd.index("--metrics-port") + 1] = str(free_port())
    if "--api-key-file" in cmd:  # the pod's mounted internal key: this local copy is open
        at = cmd.index("--api-key-file")
        del cmd[at : at + 2]
    cmd[0] = shutil.which("skiff") or cmd[0]
    proc = Process(cmd, log_path=tmp_path / "skiff-serve.log", new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        proc.wait_http_ok(f"{url}/health", 180)
        return chat(url, PROMPT)
    finally:
        proc.stop(grace=30)


def test_scale_to_two_spreads_requests_over_both_pods(cluster, router_url):
    cluster.kubectl("scale", "-n", NS, "inferenceservice/smollm2", "--replicas=2")
    wait_until("two ready pods", lambda: len(cluster.ready_pods(NS, SELECTOR)) == 2, timeout=240)
    wait_until(
        "readyReplicas 2",
        lambda: cluster.get("inferenceservice", "-n", NS, "smollm2")["status"].get("readyReplicas") == 2,
        timeout=60,
    )
    ips = [p["status"]["podIP"] for p in cluster.ready_pods(NS, SELECTOR)]
    before = {ip: pod_counters(ip) for ip in ips}
    time.sleep(5)  # the router's discovery refresh (2 s) picks up the second endpoint
    n, tokens = 16, 8
    for i in range(n):
        chat(
            router_url,
            f"Name a color that starts with the letter {chr(65 + i)}.",
            max_tokens=tokens,
            ignore_eos=True,
        )
    # Readiness probes generate too (1 token each): with exactly `tokens` per request of ours, a pod that
    # finished f requests and generated g tokens served (g - f) / (tokens - 1) of them.
    served = {}
    for ip in ips:
        f, g = (after - b for after, b in zip(pod_counters(ip), before[ip], strict=True))
        served[ip] = (g - f) / (tokens - 1)
    cluster.report["scale_to_two_requests_per_pod"] = list(served.values())
    assert sum(served.values()) == n, served
    assert all(k > 0 for k in served.values()), served


def test_spec_change_rolls_out_under_streaming_load_without_failures(cluster, router_url):
    old = {p["metadata"]["name"] for p in cluster.ready_pods(NS, SELECTOR)}
    t0 = time.monotonic()
    with StreamLoad(router_url, workers=3) as load:
        time.sleep(3)
        cluster.kubectl(
            "patch",
            "-n",
            NS,
            "inferenceservice/smollm2",
            "--type=merge",
            "-p",
            '{"spec": {"runtime": {"maxRunningRequests": 8}}}',
        )
        generation = cluster.get("inferenceservice", "-n", NS, "smollm2")["metadata"]["generation"]

        def rolled_out() -> bool:
            isvc = cluster.get("inferenceservice", "-n", NS, "smollm2")
            pods = cluster.get("pods", "-n", NS, "-l", SELECTOR)["items"]
            st = isvc.get("status", {})
            return (
                st.get("observedGeneration") == generation
                and st.get("phase") == "Ready"
                and st.get("updatedReplicas") == 2
                and st.get("readyReplicas") == 2
                and len(pods) == 2
                and not old & {p["metadata"]["name"] for p in pods}
            )

        wait_until("the rollout", rolled_out, timeout=420, interval=1)
        time.sleep(5)
    cluster.report["rollout_under_load"] = {
        "sent": load.sent,
        "ok": load.ok,
        "failed": len(load.errors),
        "seconds": round(time.monotonic() - t0, 1),
    }
    assert load.sent >= 10 and load.ok > 0, cluster.report["rollout_under_load"]
    assert load.errors == [], load.errors[:5]
    pod = cluster.ready_pods(NS, SELECTOR)[0]
    cmd = pod["spec"]["containers"][0]["command"]
    assert cmd[cmd.index("--max-running-requests") + 1] == "8", cmd


def _server_pid(cluster, pod: dict) -> int:
    """The host PID of the pod's server container (the node is this machine: kill it as an OOM would)."""
    cid = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    sock = str(Path(cluster.kubeconfig).parent / "containerd" / "containerd.sock")
    out = subprocess.run(
        ["ctr", "-a", sock, "-n", "k8s.io", "tasks", "ls"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    for line in out.splitlines()[1:]:
        task, pid, _status = line.split()
        if task == cid:
            return int(pid)
    raise AssertionError(f"no task for container {cid}")


def test_killed_server_errors_in_flight_requests_and_the_pod_comes_back(cluster, router_url):
    import openai

    cluster.kubectl("scale", "-n", NS, "inferenceservice/smollm2", "--replicas=1")
    wait_until(
        "one pod", lambda: len(cluster.get("pods", "-n", NS, "-l", SELECTOR)["items"]) == 1, timeout=120
    )
    pod = cluster.ready_pods(NS, SELECTOR)[0]
    restarts = pod["status"]["containerStatuses"][0]["restartCount"]
    client = openai.OpenAI(base_url=f"{router_url}/v1", api_key="unused", timeout=60, max_retries=0)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell a long story."}],
        max_tokens=2000,
        temperature=0,
        stream=True,
    )
    chunks = iter(stream)
    next(chunks)  # the request is in flight on the server
    t0 = time.monotonic()
    subprocess.run(["kill", "-KILL", str(_server_pid(cluster, pod))], check=True, timeout=10)
    with pytest.raises(Exception) as err:  # noqa: B017  (any transport or API error; a clean end fails)
        finish = None
        for chunk in chunks:
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        assert finish is not None, "stream ended without a finish_reason"
    assert time.monotonic() - t0 < 60, "the in-flight request hung"
    cluster.report["killed_in_flight_error"] = f"{type(err.value).__name__}: {str(err.value)[:200]}"

    def isvc_ready() -> str | None:
        return condition(cluster.get("inferenceservice", "-n", NS, "smollm2"), "Ready")

    wait_until("status not Ready", lambda: isvc_ready() == "False", timeout=60, interval=0.25)
    wait_until("status Ready again", lambda: isvc_ready() == "True", timeout=300)
    cluster.report["killed_to_ready_again_seconds"] = round(time.monotonic() - t0, 1)
    pods = cluster.get("pods", "-n", NS, "-l", SELECTOR)["items"]
    assert len(pods) == 1
    replaced = pods[0]["metadata"]["name"] != pod["metadata"]["name"]
    assert replaced or pods[0]["status"]["containerStatuses"][0]["restartCount"] == restarts + 1
    assert wait_until("an answer after recovery", lambda: chat(router_url, PROMPT), timeout=60)


def test_scale_to_zero_holds_a_request_and_wakes(cluster, router_url):
    isvc = example("autoscale-to-zero.yaml")
    name = isvc["metadata"]["name"]
    served = "smollm2-wake"
    embedded = embedded_service()["spec"]
    # The example's shape with the embedded model (no hub here) and a short idle time.
    isvc["spec"]["model"] = {"servedName": served}
    isvc["spec"]["runtime"] = embedded["runtime"]
    isvc["spec"]["resources"] = embedded["resources"]
    isvc["spec"].pop("modelCache")
    isvc["spec"]["autoscaling"].update(idleToZeroSeconds=15, scaleDownStabilizationSeconds=5)
    cluster.apply(isvc, NS)

    def replicas() -> int | None:
        return cluster.get("deployment", "-n", NS, name)["spec"].get("replicas")

    try:
        wait_until("the Deployment at 0 replicas", lambda: replicas() == 0, timeout=300, interval=1)
        wait_until(
            "no pods",
            lambda: not cluster.get("pods", "-n", NS, "-l", f"skiff.dev/inferenceservice={name}")["items"],
            timeout=180,
        )
        t0 = time.monotonic()
        answer = chat(router_url, PROMPT, model=served, timeout=300)
        wake = time.monotonic() - t0
        cluster.report["wake_from_zero_seconds"] = round(wake, 1)
        assert answer.strip(), answer
        assert replicas() >= 1
    finally:  # while the operator still runs to finalize it, pass or fail
        cluster.kubectl(
            "delete", "-n", NS, f"inferenceservice/{name}", "--ignore-not-found", "--timeout=120s"
        )


def test_delete_collects_children_and_uninstall_keeps_the_crd(cluster, helm_config):
    cluster.kubectl("delete", "-n", NS, "inferenceservice/smollm2", "--timeout=120s")

    def children() -> list[str]:
        kinds = "deployments,replicasets,pods,services,poddisruptionbudgets,endpointslices"
        return cluster.kubectl("get", kinds, "-n", NS, "-l", SELECTOR, "-o", "name").split()

    wait_until("every child gone", lambda: children() == [], timeout=180, interval=1)
    helm_config.uninstall(RELEASE)
    wait_until(
        "the operator gone", lambda: not cluster.get("deployments", "-n", SYSTEM_NS)["items"], timeout=120
    )
    crd = cluster.get("crd", "inferenceservices.skiff.dev")
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
