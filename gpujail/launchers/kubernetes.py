"""The Kubernetes launcher: one gpujail node agent per Kubernetes node, as an Indexed Job.

How this works
--------------
The coordinator has written RUN_DIR/run.json on the shared file system; this module starts the
agents (`gpujail node --run-dir RUN_DIR`) and follows them, nothing more: the scenario is driven
and judged through the run directory, as with every launcher.

    render(settings, run_dir, nodes)
                             the Job as a dict: `completionMode: Indexed`, completions = parallelism
                             = nodes (Kubernetes gives each pod JOB_COMPLETION_INDEX, the agent's
                             index), a required pod anti-affinity on kubernetes.io/hostname (one
                             pod per node), the user's ReadWriteMany claim mounted at the same path
                             as on the coordinator's host (so RUN_DIR and the jail are the same
                             paths in every pod), the user's image, runtime class and node selector
    write(job, dir)          `--render DIR`: DIR/job.json (JSON is YAML: `kubectl apply -f DIR`),
                             checked by `validate` against the bundled schemas when installed
    apply(job)               create it through the official `kubernetes` client (the user's
                             kubeconfig, or the service account when the coordinator runs in a pod)
    follow(name, nodes)      list the Job's pods, then watch them from that list's resourceVersion
                             (again after a watch ends or expires: 410 Gone), until every index
                             succeeded; the first pod that failed, cannot be scheduled or cannot
                             pull its image is `LaunchFailed`, one line naming pod, index and node
    collect(name)            which pod ran each index, on which node, and how it ended
    delete(name)             the Job and its pods (propagationPolicy Background)

`Launcher` is these behind the coordinator's launcher interface (gpujail/launchers/__init__.py):
`start` renders and applies, `gone` polls the pods (at most every POLL seconds: the coordinator asks
in its wait loops) and raises a failed pod's `LaunchFailed`, whose outcome ('backend' or 'error')
becomes the exit code (coordinator.outcome), `stop` waits for the agents to end on DIR/stop and
then deletes the Job, whatever ended the run (the coordinator calls it on its way out, Ctrl-C and
SIGTERM included), and `leftovers` names the Job or pods still there. Its lines go to
DIR/kubernetes.log.

The API is read as plain JSON (`raw_object`, `_preload_content=False`): `pod_state` judges the
API's own shape, and the tests feed it the API's JSON from a local HTTP server that the real client
talks to (tests/test_kubernetes_launcher.py). The `kubernetes` package is imported only by the
calls that talk to a cluster: rendering needs nothing but the standard library
(`pip install 'gpujail[kubernetes]'` for the rest).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from gpujail.launchers import Launcher as Base
from gpujail.launchers import LaunchFailed

# (flag, environment variable, default, help): `gpujail run` makes its --k8s-* flags from this table.
SETTINGS = [
    ("k8s-namespace", "GPUJAIL_K8S_NAMESPACE", "default", "namespace of the Job"),
    ("k8s-pvc", "GPUJAIL_K8S_PVC", "",
     "the ReadWriteMany PersistentVolumeClaim holding the jail and the run directory (required)"),
    ("k8s-mount", "GPUJAIL_K8S_MOUNT", "/gpujail",
     "where that volume is mounted, on the coordinator's host and in every pod; the run directory is under it"),
    ("k8s-image", "GPUJAIL_K8S_IMAGE", "", "container image with gpujail installed (required)"),
    ("k8s-runtime-class", "GPUJAIL_K8S_RUNTIME_CLASS", "",
     "runtimeClassName of the pods, e.g. nvidia (the GPU Operator's); '' for the cluster's default runtime"),
    ("k8s-gpus", "GPUJAIL_K8S_GPUS", "0",
     "nvidia.com/gpu each pod requests from the device plugin; 0: NVIDIA_VISIBLE_DEVICES=all instead"),
    ("k8s-node-selector", "GPUJAIL_K8S_NODE_SELECTOR", "", "KEY=VALUE[,KEY=VALUE...] the nodes must carry"),
]
OLDEST = "1.30"          # the oldest Kubernetes the Job is for: securityContext.appArmorProfile is GA from 1.30
DEADLINE = 3600          # the Job's activeDeadlineSeconds unless the coordinator says otherwise
KEEP_FINISHED = 600      # ttlSecondsAfterFinished: the cluster removes a Job its coordinator could not
POLL = 2.0               # seconds between two looks at the pods for `Launcher.gone`
RUN_LABEL = "gpujail.io/run"
INDEX = "batch.kubernetes.io/job-completion-index"   # the pod annotation Indexed Jobs set
JOB_UID = "batch.kubernetes.io/controller-uid"        # the pod label the Job controller sets (1.27+)
# Waiting reasons that end the run (a pod of a Job with restartPolicy Never): a wrong or unauthorised
# image, a bad pod spec. A registry's passing hiccup ends it too, rather than a wait of unknown length.
STUCK = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
         "CreateContainerError", "RunContainerError")
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class BadSetting(LaunchFailed):
    """One line: which setting, what was given, what is wrong (exit 2, bad input)."""

    def __init__(self, message: str):
        super().__init__("bad-input", message)


@dataclass(frozen=True)
class Settings:
    pvc: str
    image: str
    namespace: str = "default"
    mount: str = "/gpujail"
    runtime_class: str = ""
    gpus: int = 0
    node_selector: dict = field(default_factory=dict)

    @classmethod
    def parse(cls, given: dict[str, str]) -> Settings:
        """From the flags' text, keyed by flag name ('k8s-pvc': 'shared'), defaults filled in; checked."""
        text = {name: str(given.get(name, default)).strip() for name, _, default, _ in SETTINGS}
        for name in ("k8s-pvc", "k8s-image"):
            if not text[name]:
                raise BadSetting(f"--{name}: required with --launcher kubernetes")
        for name in ("k8s-namespace", "k8s-pvc", "k8s-runtime-class"):
            if text[name] and not DNS_LABEL.fullmatch(text[name]):
                raise BadSetting(f"--{name} {text[name]!r}: not a Kubernetes name (lower-case letters, digits, '-')")
        if not text["k8s-mount"].startswith("/"):
            raise BadSetting(f"--k8s-mount {text['k8s-mount']!r}: expected an absolute path")
        if not text["k8s-gpus"].isdigit():
            raise BadSetting(f"--k8s-gpus {text['k8s-gpus']!r}: expected a non-negative integer")
        selector = {}
        for pair in filter(None, (p.strip() for p in text["k8s-node-selector"].split(","))):
            key, eq, val = pair.partition("=")
            if not eq or not key:
                raise BadSetting(f"--k8s-node-selector {text['k8s-node-selector']!r}: {pair!r} is not KEY=VALUE")
            selector[key] = val
        return cls(pvc=text["k8s-pvc"], image=text["k8s-image"], namespace=text["k8s-namespace"],
                   mount=text["k8s-mount"].rstrip("/") or "/", runtime_class=text["k8s-runtime-class"],
                   gpus=int(text["k8s-gpus"]), node_selector=selector)


def job_name(run_dir: str) -> str:
    """gpujail-<the run directory's name>-<a digest of its path>: a DNS label, distinct for the
    fleets of one run (their directories are all called `run`), and short enough that the pods'
    hostnames (<job>-<index>) stay under 63 characters."""
    base = re.sub(r"[^a-z0-9-]+", "-", Path(run_dir).name.lower()).strip("-")[:30].strip("-")
    digest = hashlib.sha1(run_dir.encode()).hexdigest()[:8]
    return f"gpujail-{base}-{digest}" if base else f"gpujail-{digest}"


def render(settings: Settings, run_dir: str, nodes: int, deadline: int = DEADLINE) -> dict:
    """The Indexed Job running one agent per node on `run_dir` (absolute, under settings.mount)."""
    inside = Path(run_dir).is_absolute() and Path(run_dir).is_relative_to(settings.mount)
    if not inside:
        raise BadSetting(f"run directory {run_dir}: not under --k8s-mount {settings.mount}, "
                         "the only path the pods share with this host")
    if nodes < 1:
        raise BadSetting(f"{nodes} nodes: expected at least 1")
    name = job_name(run_dir)
    labels = {"app.kubernetes.io/name": "gpujail", RUN_LABEL: name}
    container = {
        "name": "agent",
        "image": settings.image,
        "command": ["gpujail", "node", "--run-dir", run_dir],   # the index: JOB_COMPLETION_INDEX
        "volumeMounts": [{"name": "shared", "mountPath": settings.mount}],
        # The agent says why it failed on stderr: the kubelet puts its last lines in the pod's status
        # (containerStatuses[].state.terminated.message), which `pod_state` quotes.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # The agent makes a mount namespace per worker and bind-mounts driver files in it (as the
        # kernel backend does): unshare(CLONE_NEWNS) and mount(2) need CAP_SYS_ADMIN. The runtime's
        # default seccomp and AppArmor profiles refuse mount(2) even then, so both are Unconfined;
        # the pod is not `privileged` (it sees no host devices the runtime did not give it).
        "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]},
                            "seccompProfile": {"type": "Unconfined"},
                            "appArmorProfile": {"type": "Unconfined"}},
    }
    if settings.gpus:   # the device plugin picks the GPUs and sets NVIDIA_VISIBLE_DEVICES itself
        container["resources"] = {"limits": {"nvidia.com/gpu": settings.gpus}}
    else:               # the runtime mounts the driver for "all" without a GPU being allocated
        container["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    pod = {
        "restartPolicy": "Never",
        # One agent per node: each pod is a node of the run, two on one machine would share its kernel.
        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {RUN_LABEL: name}}, "topologyKey": "kubernetes.io/hostname"}]}},
        "containers": [container],
        "volumes": [{"name": "shared", "persistentVolumeClaim": {"claimName": settings.pvc}}],
    }
    if settings.runtime_class:
        pod["runtimeClassName"] = settings.runtime_class
    if settings.node_selector:
        pod["nodeSelector"] = dict(sorted(settings.node_selector.items()))
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": settings.namespace, "labels": labels,
                     "annotations": {"gpujail.io/run-dir": run_dir}},
        "spec": {
            "completionMode": "Indexed",
            "completions": nodes,
            "parallelism": nodes,
            # An agent that failed is a failed run: a retried pod would start a node whose
            # history already has a start in it.
            "backoffLimit": 0,
            "activeDeadlineSeconds": deadline,
            "ttlSecondsAfterFinished": KEEP_FINISHED,
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def write(job: dict, out_dir: str | Path) -> Path:
    """`--render DIR`: the Job as DIR/job.json, ready for `kubectl apply -f DIR`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "job.json"
    path.write_text(json.dumps(job, indent=2) + "\n")
    return path


def validate(job: dict) -> str:
    """The Job checked strictly (no unknown field) against the Kubernetes OLDEST schemas that
    kubernetes-validate bundles (offline), as one line; BadSetting when it does not pass."""
    try:
        import kubernetes_validate
    except ImportError:
        return "not validated: pip install 'gpujail[kubernetes]' for the offline schema check"
    try:
        kubernetes_validate.validate(job, OLDEST, strict=True)
    except kubernetes_validate.ValidationError as e:
        where = ".".join(str(p) for p in e.absolute_path)
        raise BadSetting(f"the rendered Job does not validate against Kubernetes {OLDEST}: {where}: {e.message}") from None
    return f"valid for Kubernetes {OLDEST} and later (kubernetes-validate, offline, strict)"


# -- the pods, as the API describes them ---------------------------------------------------------

@dataclass(frozen=True)
class PodState:
    index: int
    pod: str
    node: str            # '' until scheduled
    state: str           # 'waiting', 'running', 'succeeded', 'failed'
    why: str = ""        # for 'failed': what happened, as the cluster said it
    outcome: str = ""    # for 'failed': 'backend' (the cluster cannot run it) or 'error' (the agent failed)
    exit_code: int | None = None

    def line(self) -> str:
        where = f" on node {self.node}" if self.node else ""
        return f"pod {self.pod} (agent index {self.index}{where}) {self.why}"


def pod_state(pod: dict) -> PodState:
    """How one pod of the Job stands, from its JSON (a list item or a watch event's object)."""
    meta, status = pod["metadata"], pod.get("status", {})
    index = int(meta.get("annotations", {}).get(INDEX, meta.get("labels", {}).get(INDEX, -1)))
    base = {"index": index, "pod": meta["name"], "node": pod.get("spec", {}).get("nodeName", "")}
    terminated = [(c["name"], c["state"]["terminated"]) for c in status.get("containerStatuses", [])
                  if "terminated" in c.get("state", {})]
    phase = status.get("phase", "Pending")
    if phase == "Succeeded":
        return PodState(**base, state="succeeded", exit_code=0)
    if phase == "Failed":
        for name, t in terminated:
            if t.get("exitCode", 0) != 0:
                said = _last_line(t.get("message", ""))
                return PodState(**base, state="failed", outcome="error", exit_code=t["exitCode"],
                                why=f"failed: container {name} exited {t['exitCode']} ({t.get('reason', '?')})"
                                    + (f": {said}" if said else ""))
        return PodState(**base, state="failed", outcome="error",
                        why=f"failed: {status.get('reason', 'Failed')}: {_last_line(status.get('message', ''))}")
    for c in status.get("conditions", []):
        if c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable":
            return PodState(**base, state="failed", outcome="backend",
                            why=f"cannot be scheduled: {_last_line(c.get('message', ''))}")
    for c in status.get("containerStatuses", []):
        waiting = c.get("state", {}).get("waiting", {})
        if waiting.get("reason") in STUCK:
            return PodState(**base, state="failed", outcome="backend",
                            why=f"cannot start container {c['name']} ({waiting['reason']}): "
                                f"{_last_line(waiting.get('message', ''))}")
    return PodState(**base, state="running" if phase == "Running" else "waiting")


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


class Pods:
    """The latest state of each index's pod, from the list and watch events, in order."""

    def __init__(self, nodes: int, log):
        self.nodes, self.log, self.latest = nodes, log, {}

    def see(self, kind: str, pod: dict) -> bool:
        """Take one pod's JSON; True when every index has succeeded, `LaunchFailed` at a failed pod
        (a pod deleted before it finished counts: evicted, preempted, deleted by hand)."""
        s = pod_state(pod)
        if kind == "DELETED" and s.state not in ("succeeded", "failed"):
            s = PodState(s.index, s.pod, s.node, "failed", "was deleted before it finished", "error")
        if self.latest.get(s.index) != s:
            self.latest[s.index] = s
            self.log(f"kubernetes: {s.line() if s.why else s.line() + s.state}")
        if s.state == "failed":
            raise LaunchFailed(s.outcome, s.line())
        return sum(p.state == "succeeded" for i, p in self.latest.items() if 0 <= i < self.nodes) == self.nodes

    def see_all(self, items: list[dict]) -> bool:
        return [self.see("LISTED", pod) for pod in items][-1:] == [True]


# -- the cluster, through the official client -----------------------------------------------------

class Cluster:
    """The Job's API calls. `api_client` is a kubernetes.client.ApiClient; by default one from the
    user's kubeconfig (KUBECONFIG, ~/.kube/config), else the pod's service account."""

    def __init__(self, settings: Settings, api_client=None, log=None):
        self.settings = settings
        self.api = api_client or connect()
        self.log = log or (lambda line: None)
        from kubernetes import client
        self.batch, self.core = client.BatchV1Api(self.api), client.CoreV1Api(self.api)
        self.selectors: dict[str, str] = {}   # Job name -> the label selector of its pods

    def apply(self, job: dict) -> str:
        name = job["metadata"]["name"]
        with api_errors(f"create Job {name} in namespace {self.settings.namespace}"):
            created = self.batch.create_namespaced_job(self.settings.namespace, job)
        # Its pods are found by this Job's uid: pods of an earlier Job of the same name (a run
        # directory used again) may still be terminating.
        self.selectors[name] = f"{JOB_UID}={created.metadata.uid}"
        self.log(f"kubernetes: created Job {name} in namespace {self.settings.namespace}")
        return name

    def selector(self, name: str) -> str:
        return self.selectors.get(name, f"{RUN_LABEL}={name}")   # a Job this Cluster did not create: by its label

    def pods(self, name: str) -> tuple[list[dict], str]:
        """The Job's pods as JSON, and the list's resourceVersion to watch from."""
        with api_errors(f"list the pods of Job {name}"):
            resp = self.core.list_namespaced_pod(self.settings.namespace, label_selector=self.selector(name),
                                                 _preload_content=False)
        listing = json.loads(resp.data)
        return listing.get("items", []), listing["metadata"].get("resourceVersion", "")

    def follow(self, name: str, nodes: int, watch_seconds: int = 60) -> dict[int, PodState]:
        """Until every index 0..nodes-1 has a pod that succeeded; `LaunchFailed` at the first that
        failed. Nothing here gives up by itself: the Job's activeDeadlineSeconds ends its pods."""
        from kubernetes import watch
        from kubernetes.client.rest import ApiException
        pods = Pods(nodes, self.log)
        while True:
            items, version = self.pods(name)
            if pods.see_all(items):
                return pods.latest
            w = watch.Watch()
            try:
                for event in w.stream(self.core.list_namespaced_pod, self.settings.namespace,
                                      label_selector=self.selector(name), resource_version=version,
                                      timeout_seconds=watch_seconds):
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED") and pods.see(event["type"], event["raw_object"]):
                        return pods.latest
            except ApiException as e:
                if e.status != 410:   # 410 Gone: that version is too old to watch from, list again
                    raise _failure(f"watch the pods of Job {name}", e) from None
            finally:
                w.stop()

    def poll(self, name: str, nodes: int) -> bool:
        """One look, for a coordinator that drives the run meanwhile: True when every index
        succeeded, `LaunchFailed` if a pod failed, else False."""
        return Pods(nodes, self.log).see_all(self.pods(name)[0])

    def collect(self, name: str) -> list[PodState]:
        """Each pod of the Job, by index: which node ran which agent, and how it ended."""
        return sorted((pod_state(p) for p in self.pods(name)[0]), key=lambda s: (s.index, s.pod))

    def delete(self, name: str) -> None:
        from kubernetes import client
        with api_errors(f"delete Job {name}"):
            try:
                self.batch.delete_namespaced_job(name, self.settings.namespace,
                                                 body=client.V1DeleteOptions(propagation_policy="Background"))
            except client.ApiException as e:
                if e.status != 404:   # already gone (its TTL, or someone else): what we wanted
                    raise
        self.log(f"kubernetes: deleted Job {name} and its pods")


def connect():
    """An ApiClient from the user's kubeconfig, else from the pod's service account."""
    try:
        from kubernetes import client, config
    except ImportError:
        raise LaunchFailed("backend", "--launcher kubernetes needs the kubernetes client: "
                                      "pip install 'gpujail[kubernetes]'") from None
    conf = client.Configuration()
    try:
        # KUBECONFIG read now: the client reads it once, when first imported
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None, client_configuration=conf)
    except (config.ConfigException, OSError) as kube_error:
        try:
            config.load_incluster_config(client_configuration=conf)
        except config.ConfigException:
            raise LaunchFailed("backend", f"no Kubernetes cluster configured: {kube_error} "
                                          "(and not running in a pod)") from None
    return client.ApiClient(conf)


@contextmanager
def api_errors(doing: str):
    """An API refusal or an unreachable server, as one line (`LaunchFailed('backend', ...)`)."""
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import HTTPError
    try:
        yield
    except ApiException as e:
        raise _failure(doing, e) from None
    except HTTPError as e:
        raise LaunchFailed("backend", f"kubernetes: cannot {doing}: the API server did not answer: {e}") from None


def _failure(doing: str, e) -> LaunchFailed:
    try:   # the API's Status object says what and why
        message = json.loads(e.body).get("message", "")
    except (TypeError, ValueError):
        message = ""
    return LaunchFailed("backend", f"kubernetes: cannot {doing}: {e.status} {e.reason}" + (f": {message}" if message else ""))


class Launcher(Base):
    """`--launcher kubernetes` for the coordinator: its options are the --k8s-* flags (SETTINGS)."""
    name = "kubernetes"

    @staticmethod
    def unavailable() -> str | None:
        try:
            connect()
        except LaunchFailed as e:
            return str(e)
        return None

    def __init__(self, **options):
        super().__init__(**options)
        # The --k8s-* flags (their GPUJAIL_K8S_* variables and ini keys read by gpujail/options.py),
        # as `gpujail run`, `gpujail reproduce` and the plugin pass them on; defaults for the others.
        self.settings = Settings.parse({name: options[name] for name, *_ in SETTINGS if options.get(name) is not None})
        self.job = ""

    def start(self, run_dir: Path, count: int) -> None:
        shared = Path(self.settings.mount)
        jail = json.loads((run_dir / "run.json").read_text()).get("jail", "") if (run_dir / "run.json").exists() else ""
        for what, path in (("run directory", run_dir), ("jail", jail)):
            if path and not Path(path).is_relative_to(shared):
                raise BadSetting(f"{what} {path}: not under --k8s-mount {shared}, the only path the pods share with "
                                 "this host (run gpujail with TMPDIR, or pytest's --basetemp, under it)")
        self.run_dir, self.count, self.seen = run_dir, count, (0.0, None)
        self.cluster = Cluster(self.settings, log=self.log)
        self.job = self.cluster.apply(render(self.settings, str(run_dir), count))

    def log(self, line: str) -> None:
        with open(self.run_dir / "kubernetes.log", "a") as f:
            f.write(line + "\n")

    def gone(self) -> str | None:
        """None while the pods run; raises the first failed pod's `LaunchFailed` (its outcome is
        the exit code's: a pod the cluster cannot schedule is not an agent's failure)."""
        at, why = self.seen
        if time.monotonic() - at >= POLL:
            try:
                why = "every pod of the Job has ended" if self.cluster.poll(self.job, self.count) else None
            except LaunchFailed as e:
                why = e
            self.seen = (time.monotonic(), why)
        if isinstance(why, LaunchFailed):
            raise why
        return why

    def stop(self, timeout: float = 10.0) -> None:
        if not self.job:
            return
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and not self.cluster.poll(self.job, self.count):
                time.sleep(min(POLL, max(0.0, deadline - time.monotonic())))
        except LaunchFailed:
            pass   # a failed pod has been said by `gone`; the Job goes all the same
        finally:
            self.cluster.delete(self.job)

    def leftovers(self, wait: float = 40.0) -> list[str]:
        """The Job's pods still there after `stop`: they get their grace period (30 s by default)."""
        if not self.job:
            return []
        deadline = time.monotonic() + wait
        while True:
            left = [f"kubernetes pod {s.pod} ({s.state})" for s in self.cluster.collect(self.job)]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(POLL)
