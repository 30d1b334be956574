"""Writes the API answers in tests/data/kubernetes/ that tests/test_kubernetes_launcher.py replays.

No cluster runs here: these are the shapes of the Kubernetes 1.30 API (a Job as the API server
returns it after create, Pods as the Job controller, the scheduler and the kubelet fill them in,
watch events, Status objects), written from the API reference, not captured from a cluster; the
tests check every object against the schemas kubernetes-validate bundles. Run it again when the
rendered Job changes:  python tests/data/kubernetes/make.py
"""

import copy
import glob
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from gpujail.launchers import kubernetes as k  # noqa: E402

out = str(Path(__file__).parent) + "/"
s = k.Settings.parse(
    {
        "k8s-pvc": "gpujail-shared",
        "k8s-image": "registry.example.com/gpujail:0.1",
        "k8s-namespace": "gpu",
        "k8s-runtime-class": "nvidia",
    }
)
job = k.render(s, "/gpujail/runs/r1", 2)
name = job["metadata"]["name"]
UID = "5f1c2a9e-7d3b-4c1e-9a0f-2b6e8d4c1a37"
created = copy.deepcopy(job)
created["metadata"].update(
    {"uid": UID, "resourceVersion": "48211", "generation": 1, "creationTimestamp": "2026-11-30T10:00:00Z"}
)
created["metadata"]["labels"] = {**created["metadata"]["labels"]}
created["spec"]["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": UID}}
created["spec"]["suspend"] = False
created["spec"]["podReplacementPolicy"] = "TerminatingOrFailed"
created["spec"]["manualSelector"] = False
created["spec"]["backoffLimitPerIndex"] = None
created["spec"].pop("backoffLimitPerIndex")
tpl = created["spec"]["template"]
tpl["metadata"]["labels"] = {
    **tpl["metadata"]["labels"],
    "batch.kubernetes.io/controller-uid": UID,
    "batch.kubernetes.io/job-name": name,
    "controller-uid": UID,
    "job-name": name,
}
tpl["metadata"]["creationTimestamp"] = None
c = tpl["spec"]["containers"][0]
c.update({"resources": {}, "terminationMessagePath": "/dev/termination-log", "imagePullPolicy": "IfNotPresent"})
tpl["spec"].update(
    {
        "dnsPolicy": "ClusterFirst",
        "schedulerName": "default-scheduler",
        "securityContext": {},
        "terminationGracePeriodSeconds": 30,
    }
)
created["status"] = {}
json.dump(created, open(out + "create-job.json", "w"), indent=2)


def pod(i, suffix, rv, node=None, phase="Pending", conditions=(), cstate=None, ready=False, started=False, restart=0):
    p = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": f"{name}-{i}-{suffix}",
            "generateName": f"{name}-{i}-",
            "namespace": "gpu",
            "uid": f"0c4f{i}e2a-1b7d-4e8f-a3c6-{suffix}0000000"[:36],
            "resourceVersion": str(rv),
            "creationTimestamp": "2026-11-30T10:00:01Z",
            "labels": {**tpl["metadata"]["labels"], "batch.kubernetes.io/job-completion-index": str(i)},
            "annotations": {"batch.kubernetes.io/job-completion-index": str(i)},
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": name,
                    "uid": UID,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "finalizers": ["batch.kubernetes.io/job-tracking"],
        },
        "spec": copy.deepcopy(tpl["spec"]),
        "status": {"phase": phase, "qosClass": "BestEffort"},
    }
    p["spec"]["hostname"] = f"{name}-{i}"
    p["spec"]["subdomain"] = name
    p["spec"]["serviceAccountName"] = "default"
    p["spec"]["serviceAccount"] = "default"
    p["spec"]["containers"][0]["env"] = p["spec"]["containers"][0]["env"] + [
        {
            "name": "JOB_COMPLETION_INDEX",
            "valueFrom": {
                "fieldRef": {
                    "apiVersion": "v1",
                    "fieldPath": "metadata.labels['batch.kubernetes.io/job-completion-index']",
                }
            },
        }
    ]
    p["spec"]["containers"][0]["volumeMounts"].append(
        {
            "name": "kube-api-access-x7q2m",
            "readOnly": True,
            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
        }
    )
    p["spec"]["volumes"].append(
        {
            "name": "kube-api-access-x7q2m",
            "projected": {
                "defaultMode": 420,
                "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {
                        "downwardAPI": {
                            "items": [
                                {
                                    "path": "namespace",
                                    "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                                }
                            ]
                        }
                    },
                ],
            },
        }
    )
    p["spec"]["tolerations"] = [
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        {
            "key": "node.kubernetes.io/unreachable",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 300,
        },
    ]
    p["spec"]["priority"] = 0
    p["spec"]["enableServiceLinks"] = True
    p["spec"]["preemptionPolicy"] = "PreemptLowerPriority"
    if node:
        p["spec"]["nodeName"] = node
        p["status"].update(
            {"hostIP": "192.0.2.1%d" % i, "hostIPs": [{"ip": "192.0.2.1%d" % i}], "startTime": "2026-11-30T10:00:02Z"}
        )
        if phase != "Pending":
            p["status"].update({"podIP": "10.244.%d.17" % (i + 1), "podIPs": [{"ip": "10.244.%d.17" % (i + 1)}]})
    p["status"]["conditions"] = [dict(cd) for cd in conditions]
    if cstate is not None:
        p["status"]["containerStatuses"] = [
            {
                "name": "agent",
                "state": cstate,
                "lastState": {},
                "ready": ready,
                "restartCount": restart,
                "image": "registry.example.com/gpujail:0.1",
                "imageID": ""
                if "waiting" in cstate
                else "registry.example.com/gpujail@sha256:3b7c9f1e0d2a4c6b8e5f7a9c1d3e5f7b9a1c3e5d7f9b1a3c5e7d9f1b3a5c7e9d",
                "started": started,
                **({} if "waiting" in cstate else {"containerID": f"containerd://9e1f{i}a7c3b5d"}),
            }
        ]
    return p


def cond(t, status, reason=None, message=None, ts="2026-11-30T10:00:02Z"):
    c = {"type": t, "status": status, "lastProbeTime": None, "lastTransitionTime": ts}
    if reason:
        c["reason"] = reason
    if message:
        c["message"] = message
    return c


def conditions(started: bool, ready: bool, reason=None, message=None) -> list[dict]:
    """A scheduled pod's conditions, as the kubelet sets them."""
    return [
        cond("PodReadyToStartContainers", str(started)),
        cond("Initialized", "True"),
        cond("Ready", str(ready), reason, message),
        cond("ContainersReady", str(ready), reason, message),
        cond("PodScheduled", "True"),
    ]


sched = conditions(False, False, "ContainersNotReady", "containers with unready status: [agent]")
running = conditions(True, True)
done = conditions(False, False, "PodCompleted")
failed_c = conditions(False, False, "PodFailed")
creating = {"waiting": {"reason": "ContainerCreating"}}
run_state = {"running": {"startedAt": "2026-11-30T10:00:04Z"}}
ok_state = {
    "terminated": {
        "exitCode": 0,
        "reason": "Completed",
        "startedAt": "2026-11-30T10:00:04Z",
        "finishedAt": "2026-11-30T10:00:31Z",
        "containerID": "containerd://9e1f0a7c3b5d",
    }
}
bad_state = {
    "terminated": {
        "exitCode": 1,
        "reason": "Error",
        "startedAt": "2026-11-30T10:00:04Z",
        "finishedAt": "2026-11-30T10:00:09Z",
        "message": "gpujail node: agent 1 starting\n"
        "gpujail node: cannot make the worker's mount namespace: unshare(CLONE_NEWNS): Operation not permitted\n",
        "containerID": "containerd://9e1f1a7c3b5d",
    }
}
nodes = ["gpu-node-a", "gpu-node-b"]


def ev(t, o):
    return json.dumps({"type": t, "object": o}, separators=(",", ":"))


def write(fname, events):
    with open(out + fname, "w") as f:
        f.write("\n".join(events) + "\n")


sfx = ["q8x2k", "m4v7d"]
rv = 48212


def lifecycle(i, end="ok"):
    global rv
    evs = []
    rv += 1
    evs.append(ev("ADDED", pod(i, sfx[i], rv)))
    rv += 1
    evs.append(ev("MODIFIED", pod(i, sfx[i], rv, conditions=[cond("PodScheduled", "True")])))
    rv += 1
    evs.append(ev("MODIFIED", pod(i, sfx[i], rv, nodes[i], conditions=sched, cstate=creating)))
    rv += 1
    evs.append(ev("MODIFIED", pod(i, sfx[i], rv, nodes[i], "Running", running, run_state, True, True)))
    if end == "ok":
        rv += 1
        evs.append(ev("MODIFIED", pod(i, sfx[i], rv, nodes[i], "Succeeded", done, ok_state)))
    else:
        rv += 1
        evs.append(ev("MODIFIED", pod(i, sfx[i], rv, nodes[i], "Failed", failed_c, bad_state)))
    return evs


a, b = lifecycle(0), lifecycle(1)
write("watch-succeeded.jsonl", [a[0], b[0], a[1], b[1], a[2], b[2], a[3], b[3], a[4], b[4]])
# the list a coordinator gets after they ended (collect), with its resourceVersion
final = [json.loads(a[4])["object"], json.loads(b[4])["object"]]
json.dump(
    {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(rv)}, "items": final},
    open(out + "pods-succeeded.json", "w"),
    indent=2,
)
json.dump(
    {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "48211"}, "items": []},
    open(out + "pods-empty.json", "w"),
    indent=2,
)
rv = 48212
a, b = lifecycle(0), lifecycle(1, end="fail")
write("watch-failed.jsonl", [a[0], b[0], a[1], b[1], a[2], b[2], a[3], b[3], b[4]])
# watch that runs halfway, then a 410 Gone in the stream
rv = 48212
a, b = lifecycle(0), lifecycle(1)
write("watch-first-half.jsonl", [a[0], b[0], a[1], b[1], a[2], b[2]])
write(
    "watch-expired.jsonl",
    [
        json.dumps(
            {
                "type": "ERROR",
                "object": {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Failure",
                    "message": "too old resource version: 48211 (48230)",
                    "reason": "Expired",
                    "code": 410,
                },
            },
            separators=(",", ":"),
        )
    ],
)
json.dump(
    {
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": "48230"},
        "items": [json.loads(a[3])["object"], json.loads(b[3])["object"]],
    },
    open(out + "pods-running.json", "w"),
    indent=2,
)
write("watch-second-half.jsonl", [a[4], b[4]])
# unschedulable: index 1 has no second node that keeps the anti-affinity
rv = 48212
a = lifecycle(0)
rv += 1
unsched = pod(
    1,
    sfx[1],
    rv,
    conditions=[
        cond(
            "PodScheduled",
            "False",
            "Unschedulable",
            "0/3 nodes are available: 1 node(s) didn't match pod anti-affinity rules, 1 node(s) had untolerated taint "
            "{node-role.kubernetes.io/control-plane: }, 1 node(s) didn't match Pod's node affinity/selector. "
            "preemption: 0/3 nodes are available: 1 No preemption victims found for incoming pod, "
            "2 Preemption is not helpful for scheduling.",
        )
    ],
)
write("watch-unschedulable.jsonl", [a[0], ev("ADDED", pod(1, sfx[1], 48213)), a[1], ev("MODIFIED", unsched)])
# image cannot be pulled
rv = 48212
a = lifecycle(0)
rv += 1
pull = pod(
    1,
    sfx[1],
    rv,
    nodes[1],
    conditions=sched,
    cstate={
        "waiting": {
            "reason": "ErrImagePull",
            "message": 'failed to pull and unpack image "registry.example.com/gpujail:0.1": failed to resolve reference '
            '"registry.example.com/gpujail:0.1": registry.example.com/gpujail:0.1: not found',
        }
    },
)
write("watch-image-pull.jsonl", [a[0], a[1], a[2], ev("ADDED", pod(1, sfx[1], 48213)), ev("MODIFIED", pull)])
# a running pod deleted (evicted / by hand): DELETED while Running
rv = 48212
a, b = lifecycle(0), lifecycle(1)
write("watch-deleted.jsonl", [a[0], b[0], a[3], b[3], ev("DELETED", json.loads(b[3])["object"])])
json.dump(
    {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": name, "group": "batch", "kind": "jobs", "uid": UID},
    },
    open(out + "delete-job.json", "w"),
    indent=2,
)
json.dump(
    {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'jobs.batch is forbidden: User "alice" cannot create resource "jobs" in API group "batch" '
        'in the namespace "gpu"',
        "reason": "Forbidden",
        "details": {"group": "batch", "kind": "jobs"},
        "code": 403,
    },
    open(out + "create-forbidden.json", "w"),
    indent=2,
)
# list items carry no kind/apiVersion in a real PodList
for f in glob.glob(out + "pods-*.json"):
    d = json.load(open(f))
    for it in d["items"]:
        it.pop("kind", None)
        it.pop("apiVersion", None)
    json.dump(d, open(f, "w"), indent=2)
lines = [json.loads(line)["object"] for line in open(out + "watch-failed.jsonl")]
zero = [o for o in lines if o["metadata"]["name"].startswith(name + "-0")][-1]
items = []
for o in (zero, lines[-1]):
    o = dict(o)
    o.pop("kind")
    o.pop("apiVersion")
    items.append(o)
json.dump(
    {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "48222"}, "items": items},
    open(out + "pods-failed.json", "w"),
    indent=2,
)
# the list a coordinator polls while index 1 cannot be scheduled (index 0 running)
rv = 48212
a = lifecycle(0)
json.dump(
    {
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": "48219"},
        "items": [
            {k: v for k, v in o.items() if k not in ("kind", "apiVersion")}
            for o in (json.loads(a[3])["object"], unsched)
        ],
    },
    open(out + "pods-unschedulable.json", "w"),
    indent=2,
)
