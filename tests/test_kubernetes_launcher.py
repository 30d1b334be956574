"""The Kubernetes launcher (gpujail/launchers/kubernetes.py), offline: no cluster runs here.

- The rendered Indexed Job is compared with golden files (tests/golden/kubernetes/;
  `GPUJAIL_UPDATE_GOLDEN=1` rewrites them) and validated, strictly (no unknown field), against the
  Kubernetes schemas that `kubernetes-validate` bundles, with every network connection refused.
- The client code runs the official `kubernetes` client, configured from a kubeconfig file as a
  user's is, against a local HTTP server (`FakeApi`, on 127.0.0.1) answering the API paths it calls
  with JSON in the API's shapes (tests/data/kubernetes/: create Job, list pods, watch events,
  delete). These were written from the Kubernetes 1.30 API reference, not captured from a cluster,
  by tests/data/kubernetes/make.py (run it again when the rendered Job changes);
  `test_recorded_objects_are_valid_kubernetes_objects` checks each against the same schemas.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.util import find_spec
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from gpujail.launchers import kubernetes as k8s
from gpujail.spec import EXIT

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data" / "kubernetes"
GOLDEN = Path(__file__).parent / "golden" / "kubernetes"
RUN_DIR = "/gpujail/runs/r1"   # the recorded responses are for this run: Job JOB in namespace gpu
JOB = k8s.job_name(RUN_DIR)
UID = "5f1c2a9e-7d3b-4c1e-9a0f-2b6e8d4c1a37"   # its uid, in tests/data/kubernetes/create-job.json
SELECTORS = (f"batch.kubernetes.io/controller-uid={UID}", f"gpujail.io/run={JOB}")

# Rendering needs only the standard library; the rest needs the `kubernetes` extra (./run-tests installs it).
MISSING = "{} is not installed: pip install '.[kubernetes]'"
needs_client = pytest.mark.skipif(find_spec("kubernetes") is None, reason=MISSING.format("the kubernetes client"))


@pytest.fixture
def kv():
    """kubernetes-validate, the offline schema validator."""
    return pytest.importorskip("kubernetes_validate", reason=MISSING.format("kubernetes-validate"))


OLDEST = k8s.OLDEST


def settings(**given) -> k8s.Settings:
    return k8s.Settings.parse({"k8s-pvc": "gpujail-shared", "k8s-image": "registry.example.com/gpujail:0.1",
                               "k8s-namespace": "gpu", **given})


VARIANTS = {
    # the GPU Operator's runtime class, NVIDIA_VISIBLE_DEVICES=all, GPU nodes only
    "runtime-class": dict(given={"k8s-runtime-class": "nvidia", "k8s-node-selector": "nvidia.com/gpu.present=true"}, nodes=3),
    # the device plugin hands out one GPU per pod (and sets NVIDIA_VISIBLE_DEVICES itself)
    "device-plugin": dict(given={"k8s-gpus": "1", "k8s-mount": "/mnt/shared/"}, nodes=2, run_dir="/mnt/shared/runs/Cold_Race.7"),
}


# -- the manifests ---------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", VARIANTS)
def test_rendered_job_matches_golden(variant):
    v = VARIANTS[variant]
    text = json.dumps(k8s.render(settings(**v["given"]), v.get("run_dir", RUN_DIR), v["nodes"]), indent=2) + "\n"
    golden = GOLDEN / f"job-{variant}.json"
    if os.environ.get("GPUJAIL_UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert golden.exists(), f"{golden} missing: GPUJAIL_UPDATE_GOLDEN=1 pytest {__file__}"
    assert text == golden.read_text(), f"the rendered Job differs from {golden}: GPUJAIL_UPDATE_GOLDEN=1 pytest {__file__} " \
                                       "rewrites it (review the diff)"


def test_rendered_job_is_what_the_agents_need():
    """The points of the design, read from the Job, so that a golden file rewritten without care
    still cannot drop one."""
    job = k8s.render(settings(**VARIANTS["runtime-class"]["given"]), RUN_DIR, 3)
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 3, 3)
    (term,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    (agent,) = pod["containers"]
    assert agent["command"] == ["gpujail", "node", "--run-dir", RUN_DIR]   # the index: JOB_COMPLETION_INDEX
    assert agent["securityContext"]["capabilities"]["add"] == ["SYS_ADMIN"]
    assert agent["terminationMessagePolicy"] == "FallbackToLogsOnError"   # the agent's last words reach the one line
    assert RUN_DIR.startswith(agent["volumeMounts"][0]["mountPath"] + "/")
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "gpujail-shared"
    assert pod["runtimeClassName"] == "nvidia" and pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}


@pytest.fixture
def offline(monkeypatch):
    """Any connection attempt from this process fails the test: the validation must need no network."""
    def refuse(self, address):
        raise AssertionError(f"network connection attempted to {address}")
    monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.mark.parametrize("version", [OLDEST, "latest"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_rendered_job_validates_offline(variant, version, offline, kv):
    from kubernetes_validate.utils import latest_version, major_minor
    v = VARIANTS[variant]
    job = k8s.render(settings(**v["given"]), v.get("run_dir", RUN_DIR), v["nodes"])
    version = major_minor(latest_version()) if version == "latest" else version
    assert kv.validate(job, version, strict=True) == version   # that version's own schemas


@pytest.mark.parametrize("break_it, where", [
    (lambda job: job["spec"].update(parallelsim=3), "parallelsim"),
    (lambda job: job["spec"].update(backoffLimit="0"), "'0' is not of type"),
    (lambda job: job["spec"]["template"]["spec"]["containers"][0].pop("name"), "'name' is a required property"),
])
def test_validation_catches_a_broken_job(break_it, where, offline, kv):
    """The validation is not vacuous: a typo, a wrong type, a missing field each fail it."""
    job = k8s.render(settings(), RUN_DIR, 2)
    break_it(job)
    with pytest.raises(kv.ValidationError) as e:
        kv.validate(job, OLDEST, strict=True)
    assert where in e.value.message


def test_the_command_says_why_a_job_does_not_validate(offline, kv):
    job = k8s.render(settings(), RUN_DIR, 2)
    assert k8s.validate(job).startswith("valid for Kubernetes 1.30")
    job["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] = "SYS_ADMIN"
    with pytest.raises(k8s.BadSetting, match=r"^the rendered Job does not validate against Kubernetes 1.30: "
                                             r"spec.template.spec.containers.0.securityContext.capabilities.add: "
                                             r"'SYS_ADMIN' is not of type 'array', 'null'$"):
        k8s.validate(job)


def test_recorded_objects_are_valid_kubernetes_objects(offline, kv):
    """The API's answers the client tests replay are objects the schemas accept, strictly."""
    checked = 0
    for path in sorted([*DATA.glob("*.json"), *DATA.glob("*.jsonl")]):
        docs = [json.loads(ln)["object"] for ln in path.read_text().splitlines()] if path.suffix == ".jsonl" \
            else [json.loads(path.read_text())]
        for doc in docs:
            if doc["kind"] == "Status":
                assert doc["status"] in ("Success", "Failure"), path
                continue
            for obj in doc.get("items", [doc]):
                kv.validate({"apiVersion": "v1", "kind": "Pod", **obj}, OLDEST, strict=True)
                checked += 1
    assert checked > 20


@pytest.mark.parametrize("given, message", [
    ({"k8s-pvc": ""}, "--k8s-pvc: required with --launcher kubernetes"),
    ({"k8s-image": " "}, "--k8s-image: required with --launcher kubernetes"),
    ({"k8s-namespace": "GPU_team"}, "--k8s-namespace 'GPU_team': not a Kubernetes name"),
    ({"k8s-node-selector": "gpu=yes,fast"}, "--k8s-node-selector 'gpu=yes,fast': 'fast' is not KEY=VALUE"),
    ({"k8s-gpus": "-1"}, "--k8s-gpus '-1': expected a non-negative integer"),
    ({"k8s-mount": "shared"}, "--k8s-mount 'shared': expected an absolute path"),
])
def test_bad_settings_are_one_line(given, message):
    with pytest.raises(k8s.BadSetting) as e:
        settings(**given)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_run_dir_outside_the_shared_volume_is_refused():
    with pytest.raises(k8s.BadSetting, match=r"^run directory /tmp/r1: not under --k8s-mount /gpujail"):
        k8s.render(settings(), "/tmp/r1", 2)
    with pytest.raises(k8s.BadSetting, match="not under"):
        k8s.render(settings(), "/gpujail-other/r1", 2)   # a prefix of the name is not a parent


def test_job_names_are_distinct_dns_labels_short_enough_for_pod_hostnames():
    assert k8s.job_name("/gpujail/runs/Cold_Race.7").startswith("gpujail-cold-race-7-")
    # every fleet of a run has a directory called `run`: their Jobs must not collide
    assert k8s.job_name("/gpujail/t/test_a/run") != k8s.job_name("/gpujail/t/test_b/run")
    long = k8s.job_name("/gpujail/runs/" + "x" * 100)
    assert len(long + "-999") <= 63 and k8s.DNS_LABEL.fullmatch(long)


def test_write_makes_a_directory_kubectl_applies(tmp_path):
    job = k8s.render(settings(), RUN_DIR, 2)
    path = k8s.write(job, tmp_path / "manifests")
    assert path == tmp_path / "manifests" / "job.json" and json.loads(path.read_text()) == job


# -- the client against the API's answers -----------------------------------------------------------

class FakeApi:
    """A local HTTP server answering the four calls the launcher makes, from files of tests/data/kubernetes/.

    `script` maps a call (create, list, watch, delete) to the answers of its successive requests,
    each (status, file); the last repeats. A watch answer streams the file's events, one JSON object
    a line, then ends the response (as the API server does when timeoutSeconds runs out), or with
    `hold=True` keeps it open until the test ends. Every request is recorded."""

    def __init__(self, script: dict[str, list]):
        self.script = {call: list(answers) for call, answers in script.items()}
        self.requests: list[tuple[str, str, dict, dict | None]] = []
        self.released = threading.Event()
        self.watching = threading.Event()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                api.answer(self, "create")

            def do_GET(self):
                watching = parse_qs(urlsplit(self.path).query).get("watch", [""])[0].lower() == "true"
                api.answer(self, "watch" if watching else "list")

            def do_DELETE(self):
                api.answer(self, "delete")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, h: BaseHTTPRequestHandler, call: str) -> None:
        url = urlsplit(h.path)
        length = int(h.headers.get("Content-Length") or 0)
        body = json.loads(h.rfile.read(length)) if length else None
        self.requests.append((call, url.path, parse_qs(url.query), body))
        paths = {"create": "/apis/batch/v1/namespaces/gpu/jobs", "list": "/api/v1/namespaces/gpu/pods",
                 "watch": "/api/v1/namespaces/gpu/pods"}
        known = url.path == paths[call] if call in paths else url.path.startswith("/apis/batch/v1/namespaces/gpu/jobs/")
        # the Job's own pods only: by its uid (a Job the client created) or by its label
        if call in ("list", "watch") and parse_qs(url.query).get("labelSelector", [""])[0] not in SELECTORS:
            known = False
        answers = self.script.get(call)
        if not known or not answers:
            status, text = 404, json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                            "message": f"no answer for {h.command} {h.path}", "reason": "NotFound", "code": 404})
        else:
            status, name, *hold = answers.pop(0) if len(answers) > 1 else answers[0]
            text = (DATA / name).read_text()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        if call != "watch":
            h.send_header("Content-Length", str(len(text.encode())))
        h.end_headers()
        if call == "watch":   # a stream: written line by line, ended by closing the connection
            for line in text.splitlines():
                h.wfile.write(line.encode() + b"\n")
                h.wfile.flush()
            self.watching.set()
            if hold:
                self.released.wait(30)
        else:
            h.wfile.write(text.encode())

    def calls(self) -> list[str]:
        return [call for call, *_ in self.requests]

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig as `kubectl config view` writes one (JSON is YAML), pointing at this server."""
        host, port = self.server.server_address
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": f"http://{host}:{port}"}}],
            "users": [{"name": "alice", "user": {"token": "not-a-secret"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "alice", "namespace": "gpu"}}]}))
        return path


@pytest.fixture
def fake_api(tmp_path, monkeypatch):
    """Starts a FakeApi with the given answers, and points KUBECONFIG at it."""
    pytest.importorskip("kubernetes", reason=MISSING.format("the kubernetes client"))
    servers = []

    def start(**script) -> FakeApi:
        api = FakeApi(script)
        api.thread.start()
        servers.append(api)
        monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig(tmp_path / "kubeconfig")))
        return api

    yield start
    for api in servers:
        api.released.set()
        api.server.shutdown()
        api.server.server_close()


FAILED_LINE = (f"pod {JOB}-1-m4v7d (agent index 1 on node gpu-node-b) failed: container agent exited 1 (Error): "
               "gpujail node: cannot make the worker's mount namespace: unshare(CLONE_NEWNS): Operation not permitted")
UNSCHEDULABLE_LINE = (f"pod {JOB}-1-m4v7d (agent index 1) cannot be scheduled: 0/3 nodes are available: 1 node(s) "
                      "didn't match pod anti-affinity rules, ")


SUCCEEDED = dict(create=[(201, "create-job.json")], list=[(200, "pods-empty.json"), (200, "pods-succeeded.json")],
                 watch=[(200, "watch-succeeded.jsonl")], delete=[(200, "delete-job.json")])


def launch(nodes: int = 2, log=None):
    """Apply, follow to the end, collect, and delete on the way out."""
    cluster = k8s.Cluster(settings(), log=log)
    name = cluster.apply(k8s.render(settings(), RUN_DIR, nodes))
    try:
        cluster.follow(name, nodes)
        return cluster.collect(name)
    finally:
        cluster.delete(name)


def test_job_applied_followed_collected_and_deleted(fake_api):
    api = fake_api(**SUCCEEDED)
    lines = []
    outcomes = launch(log=lines.append)
    assert api.calls() == ["create", "list", "watch", "list", "delete"]
    _, _, _, body = api.requests[0]
    assert body == k8s.render(settings(), RUN_DIR, 2)   # the rendered Job, as rendered
    _, _, query, _ = api.requests[2]
    assert query["labelSelector"] == [f"batch.kubernetes.io/controller-uid={UID}"] and query["resourceVersion"] == ["48211"]
    _, _, _, delete = api.requests[-1]
    assert delete["propagationPolicy"] == "Background"   # the pods go with the Job
    assert [(o.index, o.node, o.state, o.exit_code) for o in outcomes] == [
        (0, "gpu-node-a", "succeeded", 0), (1, "gpu-node-b", "succeeded", 0)]
    assert lines[0] == f"kubernetes: created Job {JOB} in namespace gpu"
    assert f"kubernetes: pod {JOB}-1-m4v7d (agent index 1 on node gpu-node-b) running" in lines
    assert lines[-1] == f"kubernetes: deleted Job {JOB} and its pods"


@pytest.mark.parametrize("watch, outcome, message", [
    ("watch-failed.jsonl", "error",
     f"pod {JOB}-1-m4v7d (agent index 1 on node gpu-node-b) failed: container agent exited 1 (Error): "
     "gpujail node: cannot make the worker's mount namespace: unshare(CLONE_NEWNS): Operation not permitted"),
    ("watch-unschedulable.jsonl", "backend",
     f"pod {JOB}-1-m4v7d (agent index 1) cannot be scheduled: 0/3 nodes are available: 1 node(s) didn't match "
     "pod anti-affinity rules"),
    ("watch-image-pull.jsonl", "backend",
     f"pod {JOB}-1-m4v7d (agent index 1 on node gpu-node-b) cannot start container agent (ErrImagePull): "
     "failed to pull and unpack image \"registry.example.com/gpujail:0.1\""),
    ("watch-deleted.jsonl", "error", f"pod {JOB}-1-m4v7d (agent index 1 on node gpu-node-b) was deleted before it finished"),
])
def test_a_pod_that_cannot_finish_is_one_line_and_the_job_is_deleted(fake_api, watch, outcome, message):
    api = fake_api(**{**SUCCEEDED, "watch": [(200, watch)]})
    with pytest.raises(k8s.LaunchFailed) as e:
        launch()
    assert e.value.outcome == outcome and str(e.value).startswith(message) and "\n" not in str(e.value)
    assert api.calls() == ["create", "list", "watch", "delete"]


def test_a_watch_that_expires_is_resumed_from_a_new_list(fake_api):
    """The API ends a watch when its timeoutSeconds runs out, and answers 410 Gone (an ERROR event)
    to one whose resourceVersion it no longer keeps: list again, watch from the new version."""
    api = fake_api(create=[(201, "create-job.json")], delete=[(200, "delete-job.json")],
                   list=[(200, "pods-empty.json"), (200, "pods-running.json"), (200, "pods-running.json"),
                         (200, "pods-succeeded.json")],
                   watch=[(200, "watch-first-half.jsonl"), (200, "watch-expired.jsonl"), (200, "watch-second-half.jsonl")])
    outcomes = launch()
    assert api.calls() == ["create", "list", "watch", "list", "watch", "list", "watch", "list", "delete"]
    assert [q["resourceVersion"] for call, _, q, _ in api.requests if call == "watch"] == [["48211"], ["48230"], ["48230"]]
    assert [o.state for o in outcomes] == ["succeeded", "succeeded"]


def test_poll_sees_the_pods_once(fake_api):
    fake_api(list=[(200, "pods-running.json"), (200, "pods-succeeded.json")])
    cluster = k8s.Cluster(settings())
    assert cluster.poll(f"{JOB}", 2) is False
    assert cluster.poll(f"{JOB}", 2) is True


def test_an_api_refusal_is_one_line_and_nothing_is_deleted(fake_api):
    api = fake_api(create=[(403, "create-forbidden.json")])
    with pytest.raises(k8s.LaunchFailed) as e:
        launch()
    assert e.value.outcome == "backend"
    assert str(e.value) == (f'kubernetes: cannot create Job {JOB} in namespace gpu: 403 Forbidden: jobs.batch is '
                            'forbidden: User "alice" cannot create resource "jobs" in API group "batch" in the namespace "gpu"')
    assert api.calls() == ["create"]


def test_a_job_already_gone_counts_as_deleted(fake_api):
    api = fake_api(**{**SUCCEEDED, "delete": [(404, "create-forbidden.json")]})   # any Status body with code 404
    assert len(launch()) == 2
    assert api.calls()[-1] == "delete"


@needs_client
def test_no_cluster_configured_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(k8s.LaunchFailed) as e:
        k8s.Cluster(settings())
    assert e.value.outcome == "backend" and str(e.value).startswith("no Kubernetes cluster configured: ")
    assert "\n" not in str(e.value)


def test_an_unreachable_api_server_is_one_line(fake_api):
    api = fake_api()
    api.server.shutdown()
    api.server.server_close()   # the kubeconfig now names a port nobody listens on
    cluster = k8s.Cluster(settings())
    cluster.api.configuration.retries = 0
    with pytest.raises(k8s.LaunchFailed, match=rf"^kubernetes: cannot create Job {JOB} in namespace gpu: "
                                               r"the API server did not answer: "):
        cluster.apply(k8s.render(settings(), RUN_DIR, 2))


# -- the launcher interface, as the coordinator (gpujail/launchers/coordinator.py) calls it ----------

@pytest.fixture
def run_dir(tmp_path):
    """A run directory as the coordinator leaves it before `start`: run.json names the jail; both
    under the shared volume's mount (tmp_path stands for it)."""
    d = tmp_path / "runs" / "r1"
    (d / "nodes").mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"launcher": "kubernetes", "agents": 2, "jail": str(tmp_path / "jail")}))
    return d


def launcher(mount: Path) -> k8s.Launcher:
    from gpujail import launchers
    return launchers.get("kubernetes", **{"k8s-pvc": "gpujail-shared", "k8s-image": "registry.example.com/gpujail:0.1",
                                          "k8s-namespace": "gpu", "k8s-mount": str(mount), "partition": "ignored"})


def test_launcher_starts_the_job_and_deletes_it_when_the_agents_ended(fake_api, run_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(k8s, "POLL", 0.0)
    api = fake_api(create=[(201, "create-job.json")], delete=[(200, "delete-job.json")],
                   list=[(200, "pods-running.json"), (200, "pods-running.json"), (200, "pods-succeeded.json"),
                         (200, "pods-empty.json")])
    la = launcher(tmp_path)
    la.start(run_dir, 2)
    assert api.requests[0][3] == k8s.render(la.settings, str(run_dir), 2)
    assert la.gone() is None                 # both pods running
    la.stop(timeout=30)                      # running, then succeeded: deleted
    assert la.leftovers() == []
    assert api.calls() == ["create", "list", "list", "list", "delete", "list"]
    log = (run_dir / "kubernetes.log").read_text().splitlines()
    job = k8s.job_name(str(run_dir))
    assert log[0] == f"kubernetes: created Job {job} in namespace gpu"
    assert log[-1] == f"kubernetes: deleted Job {job} and its pods"


@pytest.mark.parametrize("pods, outcome, line", [("pods-failed.json", "error", FAILED_LINE),
                                                  ("pods-unschedulable.json", "backend", UNSCHEDULABLE_LINE)])
def test_launcher_says_a_failed_pod_and_still_deletes_the_job(fake_api, run_dir, tmp_path, monkeypatch, pods, outcome, line):
    """`gone` raises the pod's one line with its outcome (the coordinator's callers make it the exit code)."""
    monkeypatch.setattr(k8s, "POLL", 0.0)
    api = fake_api(create=[(201, "create-job.json")], list=[(200, pods)], delete=[(200, "delete-job.json")])
    la = launcher(tmp_path)
    la.start(run_dir, 2)
    with pytest.raises(k8s.LaunchFailed) as e:
        la.gone()
    assert e.value.outcome == outcome and str(e.value).startswith(line)
    la.stop(timeout=5)
    assert api.calls()[-1] == "delete"


def test_launcher_refuses_a_run_outside_the_shared_volume(fake_api, run_dir, tmp_path):
    api = fake_api(**SUCCEEDED)
    with pytest.raises(k8s.BadSetting, match=rf"^run directory {run_dir}: not under --k8s-mount {tmp_path / 'elsewhere'}"):
        launcher(tmp_path / "elsewhere").start(run_dir, 2)
    (run_dir / "run.json").write_text(json.dumps({"jail": "/var/tmp/jail"}))
    with pytest.raises(k8s.BadSetting, match=r"^jail /var/tmp/jail: not under --k8s-mount"):
        launcher(tmp_path).start(run_dir, 2)
    assert api.calls() == []


@needs_client
def test_launcher_unavailable_without_a_cluster_says_why(tmp_path, monkeypatch):
    from gpujail import launchers
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert launchers.unavailable("kubernetes").startswith("no Kubernetes cluster configured: ")


def signalled(proc: subprocess.Popen, api: FakeApi, sig, lists: int) -> tuple[str, str]:
    """Once the process has listed the pods `lists` times, send it `sig` (None: none); its output.
    It is killed if it outlives this."""
    try:
        deadline = time.monotonic() + 60
        while sig and api.calls().count("list") < lists and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        if sig:
            assert api.calls().count("list") >= lists, f"the launcher did not look at the pods: {proc.communicate()}"
            proc.send_signal(sig)
        return proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


STOPPING = """
import sys
from pathlib import Path
from gpujail.launchers import get
la = get("kubernetes", **{"k8s-pvc": "gpujail-shared", "k8s-image": "registry.example.com/gpujail:0.1",
                          "k8s-namespace": "gpu", "k8s-mount": sys.argv[1]})
la.start(Path(sys.argv[2]), 2)
la.stop(timeout=120)   # as the coordinator after writing DIR/stop: the agents' pods never end here
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_while_stopping_still_deletes_the_job(fake_api, run_dir, tmp_path, sig):
    """A real process, a real signal, while `stop` waits for pods that do not end (a second Ctrl-C,
    or a CI's SIGTERM, while the run winds down). SIGTERM is KeyboardInterrupt too, as `gpujail`
    makes it (gpujail.commands.stop_on_signals). test_reproduce_through_the_coordinator covers a
    Ctrl-C before `stop`."""
    api = fake_api(create=[(201, "create-job.json")], list=[(200, "pods-running.json")], delete=[(200, "delete-job.json")])
    code = STOPPING if sig == signal.SIGINT else \
        "import signal\ndef stop(*_): raise KeyboardInterrupt\nsignal.signal(signal.SIGTERM, stop)\n" + STOPPING
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path), str(run_dir)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ,
                            preexec_fn=terminal_sigint)
    out, err = signalled(proc, api, sig, lists=2)
    assert "KeyboardInterrupt" in err and proc.returncode != 0
    assert api.calls()[0] == "create" and api.calls()[-1] == "delete", api.calls()
    assert (run_dir / "kubernetes.log").read_text().splitlines()[-1] == \
        f"kubernetes: deleted Job {k8s.job_name(str(run_dir))} and its pods"


# -- the command -------------------------------------------------------------------------------------

def gpujail(*args, env=None):
    return subprocess.run([sys.executable, "-m", "gpujail", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)


def test_render_writes_the_job_without_a_cluster(tmp_path, kv):
    r = gpujail("run", "--launcher", "kubernetes", "--render", str(tmp_path / "out"), "--workers", "3",
                "--k8s-pvc", "gpujail-shared", "--k8s-image", "registry.example.com/gpujail:0.1",
                env={"KUBECONFIG": str(tmp_path / "none"), "GPUJAIL_K8S_RUNTIME_CLASS": "nvidia"})
    assert r.returncode == 0, r.stderr
    assert "valid for Kubernetes 1.30 and later (kubernetes-validate, offline, strict)" in r.stdout
    job = json.loads((tmp_path / "out" / "job.json").read_text())
    assert job == k8s.render(settings(**{"k8s-namespace": "default", "k8s-runtime-class": "nvidia"}), "/gpujail/runs/example", 3)
    kv.validate(job, OLDEST, strict=True)


@pytest.mark.parametrize("args, line", [
    (["--render", "OUT"], "gpujail: --render OUT: only with --launcher kubernetes"),
    (["--launcher", "kubernetes", "--render", "OUT", "--k8s-image", "i"],
     "gpujail: --k8s-pvc: required with --launcher kubernetes"),
    (["--launcher", "kubernetes", "--render", "OUT", "--k8s-image", "i", "--k8s-pvc", "p", "--k8s-node-selector", "x"],
     "gpujail: --k8s-node-selector 'x': 'x' is not KEY=VALUE"),
    (["--launcher", "kubernetes", "--render", "OUT", "--k8s-image", "i", "--k8s-pvc", "p", "--workers", "0"],
     "gpujail: --workers 0: expected at least 1"),
    (["--launcher", "kubernetes", "--k8s-image", "i"],   # a run, no cluster: the bad input is said first
     "gpujail: --k8s-pvc: required with --launcher kubernetes"),
])
def test_render_bad_input_is_one_line_exit_2(tmp_path, args, line):
    r = gpujail("run", *[str(tmp_path / "out") if a == "OUT" else a for a in args])
    assert r.returncode == 2 and r.stderr.startswith(line.replace("OUT", str(tmp_path / "out"))), r.stderr
    assert len(r.stderr.splitlines()) == 1 and not (tmp_path / "out").exists()


@needs_client
def test_run_without_a_cluster_is_exit_3(tmp_path):
    r = gpujail("run", "--launcher", "kubernetes", "--k8s-pvc", "p", "--k8s-image", "i",
                env={"KUBECONFIG": str(tmp_path / "none"), "KUBERNETES_SERVICE_HOST": ""})
    assert r.returncode == 3 and r.stderr.startswith("gpujail: --launcher kubernetes: no Kubernetes cluster configured"), r.stderr


def terminal_sigint() -> None:
    """SIGINT's default action in the child (tests/test_cli.py says why: a CI job may inherit it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def reproduce(tmp_path, *flags, env=None) -> subprocess.Popen:
    """`gpujail reproduce cold-race --launcher kubernetes --workers 2 FLAGS`, its temporary directory
    (the run directory) under tmp_path, which stands for the shared volume's mount; no GPUJAIL_K8S_*
    variable but those of `env`."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUJAIL_K8S_")}
    return subprocess.Popen([sys.executable, "-m", "gpujail", "reproduce", "cold-race", "--launcher", "kubernetes",
                             "--workers", "2", "--out", str(tmp_path / "out"), *flags], cwd=REPO,
                            env={**clean, "TMPDIR": str(tmp_path), **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=terminal_sigint)


@pytest.mark.parametrize("pods, sig, code, line", [
    ("pods-failed.json", None, EXIT["error"], FAILED_LINE),
    ("pods-unschedulable.json", None, EXIT["backend"], UNSCHEDULABLE_LINE),
    ("pods-running.json", signal.SIGINT, 130, None)])
def test_reproduce_through_the_coordinator(fake_api, tmp_path, pods, sig, code, line):
    """`gpujail reproduce cold-race --launcher kubernetes`, the coordinator and all, against the fake
    API, its settings from the GPUJAIL_K8S_* variables: agents that never come (no cluster runs
    them). A pod that failed ends the run with its one line, once (exit 5, an agent failed); a pod
    the cluster cannot schedule is the cluster's (exit 3, as without a cluster); Ctrl-C ends it
    with 130. The Job is deleted either way."""
    api = fake_api(create=[(201, "create-job.json")], list=[(200, pods)], delete=[(200, "delete-job.json")])
    proc = reproduce(tmp_path, env={"GPUJAIL_K8S_MOUNT": str(tmp_path), "GPUJAIL_K8S_PVC": "gpujail-shared",
                                    "GPUJAIL_K8S_IMAGE": "registry.example.com/gpujail:0.1", "GPUJAIL_K8S_NAMESPACE": "gpu"})
    out, err = signalled(proc, api, sig, lists=1)
    assert api.calls()[0] == "create" and api.calls()[-1] == "delete", out + err
    assert proc.returncode == code, out + err
    if line:   # one line, one prefix: the pod and its index say which agent it was
        assert err.startswith(f"gpujail: scenario cold-race: {line}") and len(err.splitlines()) == 1, err


def test_reproduce_takes_the_k8s_flags(fake_api, tmp_path):
    """The same --k8s-* flags as `gpujail run`, no variable set: they make the Job."""
    api = fake_api(create=[(201, "create-job.json")], list=[(200, "pods-failed.json")], delete=[(200, "delete-job.json")])
    proc = reproduce(tmp_path, "--k8s-mount", str(tmp_path), "--k8s-pvc", "gpujail-shared", "--k8s-namespace", "gpu",
                     "--k8s-image", "registry.example.com/gpujail:0.1", "--k8s-runtime-class", "nvidia",
                     "--k8s-node-selector", "nvidia.com/gpu.present=true")
    out, err = signalled(proc, api, None, lists=1)
    assert proc.returncode == EXIT["error"] and FAILED_LINE in err, out + err
    job = api.requests[0][3]   # the namespace is in the path the fake answers: gpu
    pod = job["spec"]["template"]["spec"]
    assert (job["spec"]["completions"], pod["runtimeClassName"], pod["nodeSelector"]) == \
        (2, "nvidia", {"nvidia.com/gpu.present": "true"})
    assert (pod["volumes"][0]["persistentVolumeClaim"]["claimName"], pod["containers"][0]["image"]) == \
        ("gpujail-shared", "registry.example.com/gpujail:0.1")
    assert pod["containers"][0]["volumeMounts"][0]["mountPath"] == str(tmp_path)
    assert api.calls()[-1] == "delete"


@pytest.mark.parametrize("args, line", [
    (["--k8s-image", "i"], "gpujail: --k8s-pvc: required with --launcher kubernetes"),
    (["--k8s-image", "i", "--k8s-pvc", "p", "--k8s-gpus", "two"], "gpujail: --k8s-gpus 'two': expected a non-negative integer"),
])
def test_reproduce_bad_k8s_input_is_one_line_exit_2_before_asking_a_cluster(tmp_path, args, line):
    r = gpujail("reproduce", "cold-race", "--launcher", "kubernetes", *args, "--out", str(tmp_path / "out"),
                env={"KUBECONFIG": str(tmp_path / "none")})
    assert r.returncode == EXIT["bad-input"] and r.stderr == line + "\n", r.stderr
    assert not (tmp_path / "out").exists()


def test_reproduce_with_its_run_outside_the_shared_volume_is_bad_input(fake_api, tmp_path):
    """The run directory (under TMPDIR) must be under --k8s-mount: one line, exit 2, nothing created."""
    api = fake_api(**SUCCEEDED)
    proc = reproduce(tmp_path, "--k8s-mount", str(tmp_path / "shared"), "--k8s-pvc", "p", "--k8s-image", "i")
    out, err = signalled(proc, api, None, lists=0)
    assert proc.returncode == EXIT["bad-input"], out + err
    assert err.startswith(f"gpujail: scenario cold-race: run directory {tmp_path}/gpujail-reproduce-") \
        and f"not under --k8s-mount {tmp_path / 'shared'}" in err and len(err.splitlines()) == 1, err
    assert api.calls() == []


def test_run_on_a_cluster_that_cannot_schedule_the_agents_is_exit_3(fake_api, tmp_path):
    """`gpujail run --launcher kubernetes` whose agents' pods cannot be scheduled did not test the
    implementation: one line naming the pod and why, exit 3 (as without a cluster), no invariant
    reported failed, the Job deleted."""
    api = fake_api(create=[(201, "create-job.json")], list=[(200, "pods-unschedulable.json")],
                   delete=[(200, "delete-job.json")])
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUJAIL_K8S_")}
    r = subprocess.run([sys.executable, "-m", "gpujail", "run", "--impl", "reference", "-n", "0", "--reports",
                        str(tmp_path / "reports"), "--launcher", "kubernetes", "--workers", "2",
                        "--k8s-mount", str(tmp_path), "--k8s-pvc", "gpujail-shared", "--k8s-namespace", "gpu",
                        "--k8s-image", "registry.example.com/gpujail:0.1",
                        "chaos", "-k", "test_scenario and cold-race and not random"], cwd=REPO,
                       env={**clean, "TMPDIR": str(tmp_path)}, capture_output=True, text=True, timeout=300)
    assert r.returncode == EXIT["backend"], r.stdout[-2000:] + r.stderr
    assert r.stderr.startswith(f"gpujail: --launcher kubernetes: {UNSCHEDULABLE_LINE}"), r.stderr
    assert len(r.stderr.splitlines()) == 1, r.stderr
    from gpujail.report import totals
    summary = json.loads((tmp_path / "reports" / "summary.json").read_text())
    assert not totals(summary).get("failed") and summary["unavailable"].startswith("--launcher kubernetes: pod ")
    assert api.calls()[0] == "create" and api.calls()[-1] == "delete"
