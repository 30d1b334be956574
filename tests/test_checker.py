"""Tests for chaos/checker.py: the pure judge of a run's history (SPEC section 6).

Pure tests: no kernel, no file system but tmp_path for the command line. Each test writes a small
history the way the run's processes would (node ids, pids, relative times starting at t=100 so
that messages must subtract the first event's time) and reads the verdict as a person would: the
invariant, the violating event, the chain that led to it and the one-line explanation.
"""
from __future__ import annotations

import copy
import json
import random
import stat

import pytest

from gpujail.chaos import checker
from gpujail.chaos.checker import UNKNOWN, InvariantResult, Violation, check, same_file
from gpujail.spec import EXIT

JAIL = "/srv/jail"
LIB = "usr/lib/x86_64-linux-gnu"
NVML = f"{LIB}/libnvidia-ml.so.550.54.15"
CUDA = f"{LIB}/libcuda.so.550.54.15"
GSP = "lib/firmware/nvidia/550.54.15/gsp_ga10x.bin"
SMI = "usr/bin/nvidia-smi"
FILES = [(NVML, True), (CUDA, True), (GSP, False), (SMI, False)]
T0 = 100.0
REG, DIR, LNK = stat.S_IFREG | 0o644, stat.S_IFDIR | 0o755, stat.S_IFLNK | 0o777
NO_SUCH = f"{JAIL}/{NVML}: cannot open shared object file: No such file or directory"


class History:
    """A history under construction; `add` returns the event so tests can point at it."""

    def __init__(self):
        self.events: list[dict] = []

    def add(self, t: float, node: str, kind: str, pid: int = 1, **fields) -> dict:
        event = {"t": T0 + t, "node": node, "pid": pid, "kind": kind, **fields}
        self.events.append(event)
        return event

    def ready_worker(self, t: float, node: str, *, missing: int = 4, lock: bool | None = None) -> dict:
        """A reference start: worker.start .. impl.* .. cli .. worker.ready (returns worker.ready)."""
        self.add(t, node, "node.up")
        self.add(t + .001, node, "worker.start", pid=9000, impl="reference", attempt=0)
        self.add(t + .002, node, "impl.start", argv=["python3", "-m", "gpujail.reference_impl", "reference"])
        self.add(t + .010, node, "impl.begin", pid=2, impl="reference", role="gpu-worker", action="start")
        self.add(t + .011, node, "impl.placeholders", pid=2, total=4, missing=missing)
        if lock if lock is not None else missing:
            self.add(t + .012, node, "impl.lock.wait", pid=2, lock=checker.PLACEHOLDER_LOCK)
            self.add(t + .013, node, "impl.lock.acquired", pid=2, lock=checker.PLACEHOLDER_LOCK, waited=0.0)
            self.add(t + .014, node, "impl.lock.released", pid=2, lock=checker.PLACEHOLDER_LOCK)
        self.add(t + .020, node, "cli.start", pid=4, argv=["configure", JAIL], rootfs=JAIL)
        for rel, _ in FILES:
            self.add(t + .021, node, "cli.mount", pid=4, src="/" + rel, dst=f"{JAIL}/{rel}")
        self.add(t + .022, node, "cli.exit", pid=4, code=0)
        self.add(t + .030, node, "impl.verified", pid=2, mounts=len(FILES))
        self.add(t + .031, node, "impl.ready", pid=2, impl="reference", role="gpu-worker", action="start")
        self.add(t + .040, node, "impl.exit", code=0, duration=0.038, stderr="")
        return self.add(t + .041, node, "worker.ready", pid=9000, attempt=0)

    def failing_cli(self, t: float, node: str, unlinked: list[str], pid: int = 4) -> dict:
        """A CLI whose failpoint fires after it mounted `unlinked`; its cleanup unlinks them.
        Returns the failpoint event."""
        self.add(t, node, "cli.start", pid=pid, argv=["configure", JAIL], rootfs=JAIL)
        for rel in unlinked:
            self.add(t + .001, node, "cli.mount", pid=pid, src="/" + rel, dst=f"{JAIL}/{rel}")
        self.add(t + .002, node, "failpoint", pid=pid, name="cli.before_mount", hit=3, action="off", arg=None,
                 path=f"{JAIL}/{CUDA}")
        fp = self.add(t + .003, node, "failpoint", pid=pid, name="cli.before_mount", hit=4, action="return",
                      arg="EIO", path=f"{JAIL}/{CUDA}")
        self.add(t + .004, node, "cli.fail", pid=pid, mounted=len(unlinked),
                 error=f"mount error: mount operation failed: /{CUDA}: input/output error")
        for i, rel in enumerate(unlinked):
            self.add(t + .005 + i / 100, node, "cli.cleanup.umount", pid=pid, path=f"{JAIL}/{rel}")
            self.add(t + .006 + i / 100, node, "cli.cleanup.unlink", pid=pid, path=f"{JAIL}/{rel}", size=0)
        self.add(t + .02, node, "cli.exit", pid=pid, code=1, error="mount error: mount operation failed")
        return fp

    def probe(self, t: float, node: str, began: float | None = None, **bad: dict) -> dict:
        """A probe of every file, written at `t` (begun at `began`, if given); `bad` maps a file's
        name (NVML, CUDA, ...) to what went wrong."""
        results = []
        for rel, load in FILES:
            r = {"path": f"{JAIL}/{rel}", "attached": True, "size": 4096, "same_bytes": True}
            if load:
                r["loader"] = "ok"
            r.update(bad.get(rel, {}))
            results.append(r)
        return self.add(t, node, "probe", results=results, **({} if began is None else {"began": T0 + began}))


def detached(loader: str | None = NO_SUCH) -> dict:
    out = {"attached": False, "size": None, "error": "No such file or directory"}
    if loader:
        out["loader"] = loader
    return out


def jail_snapshot() -> dict:
    """A small jail image as fixtures/jail.py `snapshot` gives it."""
    return {"etc": (DIR, 0, None), "etc/debian_version": (REG, 6, None), "usr": (DIR, 0, None),
            "usr/lib": (DIR, 0, None), LIB: (DIR, 0, None), "usr/bin": (DIR, 0, None),
            "lib": (LNK, 7, "usr/lib"), f"{LIB}/libncurses.so": (REG, 31, None),
            f"{LIB}/libpthread.a": (REG, 8, None), f"{LIB}/libgpujail-example.so.1.2.3": (REG, 2048, None),
            f"{LIB}/libgpujail-example.so.1": (LNK, 25, "libgpujail-example.so.1.2.3")}


def populated(before: dict) -> dict:
    """`before` after a clean cold start: markers, 0-byte placeholders, parents, locks, flag, cache."""
    after = dict(before)
    after.update({
        NVML: (REG, 26, None), CUDA: (REG, 26, None), SMI: (stat.S_IFREG | 0o755, 26, None),
        "usr/lib/firmware": (DIR, 0, None), "usr/lib/firmware/nvidia": (DIR, 0, None),
        "usr/lib/firmware/nvidia/550.54.15": (DIR, 0, None),
        "usr/lib/firmware/nvidia/550.54.15/gsp_ga10x.bin": (stat.S_IFREG | 0o444, 0, None),
        "usr/lib/i386-linux-gnu": (DIR, 0, None),
        "usr/lib/i386-linux-gnu/libcuda.so.550.54.15": (REG, 26, None),
        "etc/complement_jail_gpu_placeholders.lock": (REG, 0, None),
        "etc/complement_jail_ldconfig.lock": (REG, 0, None),
        "etc/gpu_libs_installed.flag": (REG, 0, None), "etc/ld.so.cache": (REG, 827, None),
        f"{LIB}/libnvidia-ml.so.1": (LNK, 25, "libnvidia-ml.so.550.54.15"),
        f"{LIB}/libcuda.so.1": (LNK, 20, "libcuda.so.550.54.15"),
    })
    return after


def good_final(**overrides) -> dict:
    before = jail_snapshot()
    final = {"jail": JAIL, "transient_only": True, "jail_before": before, "jail_after": populated(before),
             "outside_changes": [], "host_mounts": [], "processes": [], "temp_dirs": []}
    final.update(overrides)
    return final


def good_run() -> History:
    """A (cold) and B (warm) become ready and every probe sees every file intact."""
    h = History()
    h.ready_worker(0.0, "A")
    h.probe(0.06, "A")
    h.ready_worker(0.1, "B", missing=0)
    h.probe(0.16, "B")
    h.probe(0.5, "A")
    h.probe(0.5, "B")
    h.add(0.6, "host", "chaos.end")
    return h


def statuses(verdict) -> dict[str, str]:
    return {inv: r.status for inv, r in verdict.results.items()}


# -- the seed bug, judged --------------------------------------------------------------------

def test_seed_bug_is_an_inv1_violation_with_its_causal_chain():
    """INV-1, seed 000 second half: A is ready and intact; B's CLI fails at an injected failpoint,
    its cleanup unlinks the 0-byte placeholder under A's NVML mount, and A's next probe finds the
    file gone. The verdict names A, B, the file, the time and the loader's words, and the chain is
    failpoint -> cli.fail -> cli.cleanup.unlink."""
    h = History()
    h.ready_worker(0.0, "A")
    h.probe(0.06, "A")
    h.add(0.2, "B", "worker.start", pid=9000, impl="legacy", attempt=0)
    fp = h.failing_cli(0.3, "B", [SMI, NVML])
    bad = h.probe(0.412, "A", **{NVML: detached()})
    verdict = check(h.events, good_final(transient_only=False))

    assert verdict.valid is False
    assert verdict.invariant == "INV-1"
    assert verdict.first_violation is bad
    assert [e["kind"] for e in verdict.chain] == ["failpoint", "cli.fail", "cli.cleanup.unlink"]
    assert verdict.chain[0] is fp
    assert verdict.chain[2]["path"] == f"{JAIL}/{NVML}"
    text = verdict.explanation
    assert text.startswith(f"worker A lost {NVML}: mount detached")
    assert "at t=0.412s" in text and "worker B's CLI cleanup unlinked it at t=0.316s" in text
    assert text.endswith("loader says: cannot open shared object file: No such file or directory")
    assert statuses(verdict) == {"INV-1": "FAIL", "INV-2": "PASS", "INV-3": "PASS", "INV-4": "PASS",
                                 "INV-5": "PASS", "INV-6": "PASS"}


def test_a_network_jail_loss_names_the_remote_unlink_and_the_lookup_that_detached():
    """K-2 (SPEC section 3, a jail on GlusterFS): B's cleanup unlinks the placeholder under A's NVML
    mount through B's own client, but A's client still has the dentry, so A's next probe still sees
    the file; only A's lookup after that finds it gone and detaches the mount. The chain ends with
    the probe that still saw it, and the verdict says which lookup detached it."""
    h = History()
    h.ready_worker(0.0, "A")
    h.probe(0.06, "A")
    h.failing_cli(0.3, "B", [NVML])
    still = h.probe(0.35, "A")   # the remote unlink at t=0.306 has not detached A's mount yet
    h.probe(0.412, "A", **{NVML: detached()})
    verdict = check(h.events, good_final(transient_only=False))

    assert verdict.invariant == "INV-1"
    assert [e["kind"] for e in verdict.chain] == ["failpoint", "cli.fail", "cli.cleanup.unlink", "probe"]
    assert verdict.chain[-1] is still
    assert ("its mount outlived that unlink (still intact at t=0.350s) until its own lookup at t=0.412s "
            "found the file gone and detached it (K-2)") in verdict.explanation


@pytest.mark.parametrize("error", ["Transport endpoint is not connected", "Software caused connection abort"])
def test_a_node_the_harness_cut_off_its_network_jail_lost_nothing(error):
    """A network fault the harness injects (its own GlusterFS client killed, a brick down) makes that
    node's probes fail with ENOTCONN, ECONNABORTED (a request in flight as the client went) or EIO:
    the fault's doing, not a loss an implementation caused. The same error with no such fault is
    still INV-1."""
    cut = {"attached": False, "size": None, "error": error}
    # the fault written before the probe; written after it (the killed client's daemon waited for)
    # but begun before; none at all
    for written, began, cut_off in ((0.2, 0.19, True), (0.4, 0.25, True), (None, None, False)):
        h = History()
        h.ready_worker(0.0, "A")
        h.probe(0.06, "A")
        if written:
            h.add(written, "host", "jailfs.fault", fault="lose-client", worker="A", pids=[1234], began=T0 + began)
        h.probe(0.3, "A", **{NVML: cut})
        verdict = check(h.events, good_final(transient_only=False))
        assert verdict.results["INV-1"].valid is cut_off, (written, verdict.explanation)
    # the brick down from 0.2 to 0.35: a round that began under it and ended after it came back is
    # excused; one that began after it came back is not
    for began, excused in ((0.3, True), (0.36, False)):
        h = History()
        h.ready_worker(0.0, "A")
        h.probe(0.06, "A")
        h.add(0.2, "host", "jailfs.fault", fault="brick-down", worker="", pids=[1234])
        h.add(0.35, "host", "jailfs.clear", fault="brick-down", worker="")
        h.probe(0.4, "A", began=began, **{NVML: cut})
        verdict = check(h.events, good_final(transient_only=False))
        assert verdict.results["INV-1"].valid is excused, (began, verdict.explanation)


def test_seed_bug_summary_reads_as_a_story():
    h = History()
    h.ready_worker(0.0, "A")
    h.probe(0.06, "A")
    h.failing_cli(0.3, "B", [NVML])
    h.probe(0.412, "A", **{NVML: detached()})
    lines = check(h.events, good_final(transient_only=False)).summary().splitlines()
    assert lines[0] == "verdict: INVALID (INV-1)"
    assert [ln.split()[0] for ln in lines[1:7]] == ["INV-1", "INV-2", "INV-3", "INV-4", "INV-5", "INV-6"]
    assert "FAIL" in lines[1] and all("PASS" in ln for ln in lines[2:7])
    chain = lines[lines.index("causal chain:") + 1:]
    assert chain[0] == (f"  t=0.303s B: failpoint cli.before_mount hit 4: return(EIO) at {CUDA}")
    assert chain[1].startswith("  t=0.304s B: cli.fail mount error:")
    assert chain[2] == f"  t=0.306s B: cli.cleanup.unlink {NVML} (0 bytes)"
    assert chain[3].startswith("  t=0.412s A: probe 4 files, 1 bad: " + NVML) and chain[3].endswith("<- violation")


def test_file_too_short_after_another_cli_recreated_the_placeholder():
    """The second symptom: a later CLI recreated a 0-byte placeholder where the mount was."""
    h = History()
    h.ready_worker(0.0, "A")
    h.probe(0.06, "A")
    h.failing_cli(0.3, "B", [NVML])
    h.probe(0.5, "A", **{NVML: {"attached": False, "size": 0, "same_bytes": False,
                                "loader": f"{JAIL}/{NVML}: file too short"}})
    v = check(h.events, good_final(transient_only=False))
    assert v.invariant == "INV-1"
    assert "0-byte file that is not the host file (a placeholder)" in v.explanation
    assert v.explanation.endswith("loader says: file too short")


def test_chain_follows_the_jail_symlink():
    """A probe through `lib -> usr/lib` and an unlink of the resolved usr/lib path are one file."""
    h = History()
    h.ready_worker(0.0, "A")
    h.probe(0.06, "A")
    h.failing_cli(0.3, "B", [NVML])
    probe = h.probe(0.5, "A")
    probe["results"][0] = {"path": f"{JAIL}/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15", **detached()}
    v = check(h.events, good_final(transient_only=False))
    assert [e["kind"] for e in v.chain] == ["failpoint", "cli.fail", "cli.cleanup.unlink"]
    assert "lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15" in v.explanation


def test_same_file():
    assert same_file(f"{JAIL}/lib/firmware/x.bin", f"{JAIL}/usr/lib/firmware/x.bin", (JAIL,))
    assert same_file(f"{JAIL}/{NVML}", NVML, (JAIL,))
    assert not same_file(f"{JAIL}/{NVML}", f"{JAIL}/{CUDA}", (JAIL,))
    assert same_file(f"/a/{NVML}", "/b/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15")   # no known jail: parent + name


def test_chain_skips_other_files_later_unlinks_and_the_victims_own_node():
    """Only an earlier removal of the same file by another node explains a loss."""
    h = History()
    h.ready_worker(0.0, "A")
    h.probe(0.06, "A")
    h.failing_cli(0.2, "B", [CUDA])              # another file
    h.failing_cli(0.25, "A", [NVML], pid=7)      # A's own namespace: EBUSY in reality, not A's cause
    h.probe(0.4, "A", **{NVML: detached()})
    h.failing_cli(0.6, "C", [NVML])              # after the probe
    v = check(h.events, good_final(transient_only=False))
    assert v.invariant == "INV-1" and v.chain == []
    assert v.explanation.startswith(f"worker A lost {NVML}: mount detached")
    assert "nothing in the history removed it" in v.explanation


def test_chain_takes_the_failing_cli_process_and_the_harness_fault():
    """The chain's cli.fail and failpoint come from the CLI process that unlinked (same node and
    pid, after its own cli.start: pids repeat across restarts), led by the chaos.fault that armed it."""
    h = History()
    h.ready_worker(0.0, "A")
    h.probe(0.06, "A")
    h.add(0.1, "B", "cli.start", pid=4, rootfs=JAIL)
    h.add(0.11, "B", "failpoint", pid=4, name="cli.before_mkdir", hit=1, action="return", arg="EEXIST")
    h.add(0.12, "B", "cli.fail", pid=4, error="mount error: file creation failed", mounted=0)
    fault = h.add(0.25, "host", "chaos.fault", pid=1, worker="B", failpoint="cli.before_mount",
                  term="4*off->return(EIO)")
    h.add(0.26, "host", "chaos.fault", pid=1, worker="C", failpoint="cli.before_mount", term="return(EIO)")
    fp = h.failing_cli(0.3, "B", [NVML])
    h.probe(0.5, "A", **{NVML: detached()})
    v = check(h.events, good_final(transient_only=False))
    assert [e["kind"] for e in v.chain] == ["chaos.fault", "failpoint", "cli.fail", "cli.cleanup.unlink"]
    assert v.chain[0] is fault and v.chain[1] is fp and v.chain[2]["t"] == pytest.approx(T0 + 0.304)


def test_populate_cleanup_is_a_cause_too():
    h = History()
    h.ready_worker(0.0, "A")
    h.probe(0.06, "A")
    cleanup = h.add(0.3, "P", "impl.populate_cleanup", pid=2, removed=[NVML])
    h.probe(0.5, "A", **{NVML: detached()})
    v = check(h.events, good_final(transient_only=False))
    assert v.chain == [cleanup]
    assert "worker P's populate-jail cleanup removed it at t=0.300s" in v.explanation


def test_every_lost_file_is_listed_once_per_ready_span():
    h = History()
    h.ready_worker(0.0, "A")
    h.ready_worker(0.0, "C", missing=0)
    h.probe(0.06, "A")
    h.probe(0.06, "C")
    h.failing_cli(0.3, "B", [NVML, CUDA])
    for t in (0.5, 0.6, 0.7):
        h.probe(t, "A", **{NVML: detached(), CUDA: detached()})
        h.probe(t, "C", **{NVML: detached(), CUDA: detached()})
    v = check(h.events, good_final(transient_only=False))
    assert len(v.results["INV-1"].violations) == 4
    assert v.results["INV-1"].note == "4 files lost on 2 workers"
    assert "3 more violation(s):" in v.summary()


def test_all_good_history_is_valid():
    v = check(good_run().events, good_final())
    assert v.valid is True, v.summary()
    assert set(statuses(v).values()) == {"PASS"}
    assert v.invariant is None and v.first_violation is None and v.chain == [] and v.explanation is None
    assert v.summary().splitlines()[0] == "verdict: VALID"
    assert "4 probes of 2 ready spans" in v.results["INV-1"].note


def test_probes_before_ready_and_after_the_end_do_not_count():
    """INV-1 holds from worker.ready until the worker stops (exit, restart, kill)."""
    h = History()
    h.probe(0.0, "A", **{NVML: detached()})       # before its first start: not ready yet
    h.ready_worker(0.01, "A")
    h.probe(0.06, "A")
    h.add(0.1, "host", "chaos.kill", worker="A")
    h.probe(0.2, "A", **{NVML: detached()})       # a dead worker loses everything: not a violation
    assert check(h.events, good_final(transient_only=False)).valid is True


def test_check_is_pure_and_order_independent():
    h = History()
    h.ready_worker(0.0, "A")
    h.probe(0.06, "A")
    h.failing_cli(0.3, "B", [NVML])
    h.probe(0.412, "A", **{NVML: detached()})
    events = h.events
    frozen = copy.deepcopy(events)
    first = check(events, good_final(transient_only=False))
    assert events == frozen
    shuffled = events[:]
    random.Random(7).shuffle(shuffled)
    again = check(shuffled, good_final(transient_only=False))
    assert again.explanation == first.explanation and again.chain == first.chain
    json.dumps(first.to_dict())   # a report can carry it


# -- INV-2 convergence -------------------------------------------------------------------------

def test_inv2_fails_when_a_worker_never_becomes_ready():
    h = good_run()
    h.add(0.2, "C", "worker.start", pid=9000, impl="reference", attempt=0)
    h.add(0.3, "C", "worker.exit", pid=9000, code=3, error="reference: lock not acquired within 1s")
    h.add(0.35, "C", "worker.restart", pid=9000, attempt=1)
    h.add(0.35, "C", "worker.start", pid=9000, impl="reference", attempt=1)
    last = h.add(0.45, "C", "worker.exit", pid=9000, code=4, error="reference: `nvidia-container-cli configure` failed")
    v = check(h.events, good_final())
    assert v.valid is False and v.invariant == "INV-2"
    assert v.first_violation is last
    assert v.explanation == ("worker C never became ready: 2 starts, the last exited at t=0.450s with code 4: "
                             "reference: `nvidia-container-cli configure` failed")
    assert [e["code"] for e in v.chain] == [3]


def test_inv2_passes_when_a_restart_converges():
    h = good_run()
    h.add(0.2, "C", "worker.start", pid=9000, impl="reference", attempt=0)
    h.add(0.3, "C", "worker.exit", pid=9000, code=4, error="cli failed")
    h.ready_worker(0.35, "C", missing=0)
    h.probe(0.5, "C")
    v = check(h.events, good_final())
    assert v.results["INV-2"].valid is True and v.valid is True, v.summary()


def test_inv2_restart_bound_and_permanent_faults():
    h = good_run()
    h.add(0.2, "C", "worker.start", pid=9000, impl="reference", attempt=0)
    h.add(0.3, "C", "worker.exit", pid=9000, code=4, error="cli failed")
    h.add(0.31, "C", "worker.start", pid=9000, impl="reference", attempt=1)
    h.add(0.4, "C", "worker.ready", pid=9000, attempt=1)
    assert check(h.events, good_final(max_restarts=0)).results["INV-2"].valid is False
    assert check(h.events, good_final(max_restarts=1)).results["INV-2"].valid is True
    h.add(0.5, "D", "worker.start", pid=9000, impl="reference", attempt=0)
    h.add(0.6, "D", "worker.exit", pid=9000, code=8, error="read-only jail")
    assert check(h.events, good_final(transient_only=False)).results["INV-2"].valid is True
    assert check(h.events, good_final(transient_only=True)).results["INV-2"].valid is False


# -- INV-3 jail hygiene ------------------------------------------------------------------------

def test_inv3_fails_on_changed_removed_and_unexpected_entries():
    before = jail_snapshot()
    after = populated(before)
    after[f"{LIB}/libncurses.so"] = (REG, 0, None)               # rewritten pre-existing file
    del after[f"{LIB}/libpthread.a"]                              # removed pre-existing file
    after[f"{LIB}/libnvidia-opencl.so.550.54.15"] = (REG, 4096, None)   # a real-sized copy, not a placeholder
    after["etc/passwd"] = (REG, 10, None)
    h = good_run()
    eater = h.add(0.3, "P", "impl.populate_cleanup", pid=2, removed=[f"{LIB}/libpthread.a"])
    v = check(h.events, good_final(jail_after=after, outside_changes=["/etc/ld.so.conf"]))
    r = v.results["INV-3"]
    assert r.valid is False and v.invariant == "INV-3"
    texts = [x.explanation for x in r.violations]
    assert "jail hygiene: /etc/ld.so.conf changed outside the jail" in texts
    assert f"jail hygiene: {LIB}/libncurses.so changed from a 31-byte file 644 to a 0-byte file 644" in texts
    assert any(t.startswith(f"jail hygiene: {LIB}/libpthread.a removed (was a 8-byte file 644); "
                            "last touched by worker P's impl.populate_cleanup at t=0.300s") for t in texts)
    assert any(t.startswith(f"jail hygiene: {LIB}/libnvidia-opencl.so.550.54.15 appeared (a 4096-byte file") for t in texts)
    assert any("etc/passwd appeared" in t for t in texts)
    assert v.first_violation is eater   # the only violation with an event comes first


def test_inv3_passes_on_placeholders_locks_flag_and_ldconfig_outputs():
    before = jail_snapshot()
    before[f"{LIB}/libnvidia-cfg.so.550.54.15"] = (REG, 0, None)   # an old placeholder, then cleaned up
    before[checker.FLAG] = (REG, 0, None)
    after = populated(before)
    del after[f"{LIB}/libnvidia-cfg.so.550.54.15"]
    del after[checker.FLAG]
    v = check(good_run().events, good_final(jail_before=before, jail_after=after))
    assert v.results["INV-3"].valid is True, v.summary()


def test_inv3_snapshot_from_json_lists():
    """A final state read back from JSON carries lists, not tuples."""
    final = json.loads(json.dumps(good_final()))
    assert check(good_run().events, final).results["INV-3"].valid is True


# -- INV-4 no lock on warm starts --------------------------------------------------------------

def test_inv4_fails_when_a_warm_start_takes_the_placeholder_lock():
    h = good_run()
    h.ready_worker(0.2, "C", missing=0, lock=True)
    h.probe(0.3, "C")
    v = check(h.events, good_final())
    assert v.valid is False and v.invariant == "INV-4"
    assert v.first_violation["kind"] == "impl.lock.wait" and v.first_violation["node"] == "C"
    assert [e["kind"] for e in v.chain] == ["impl.begin", "impl.placeholders"]
    assert v.explanation == ("worker C took the placeholder lock on a warm start: at t=0.211s it found 0 of 4 files "
                             f"missing, yet waited for {checker.PLACEHOLDER_LOCK} at t=0.212s")


def test_inv4_passes_for_cold_starts_and_other_locks():
    h = good_run()           # A cold with the lock, B warm without
    h.add(0.3, "B", "impl.start", argv=["x"])
    h.add(0.31, "B", "impl.placeholders", pid=2, total=4, missing=0)
    h.add(0.32, "B", "impl.lock.wait", pid=2, lock="etc/complement_jail_ldconfig.lock")   # REF-8's own lock
    h.add(0.33, "B", "impl.exit", code=0)
    r = check(h.events, good_final()).results["INV-4"]
    assert r.valid is True and r.note == "2 warm starts, none took the lock"


def test_inv4_without_placeholder_events():
    """Without impl.placeholders a lock wait cannot be judged (warm or cold?): UNKNOWN. An
    instrumented implementation that never waited for the lock passes; an uninstrumented one
    (e.g. a shell script) is UNKNOWN."""
    events = [e for e in good_run().events if e["kind"] != "impl.placeholders"]
    assert check(events, good_final()).results["INV-4"].valid == UNKNOWN     # A waited: warm or cold?
    events = [e for e in events if not e["kind"].startswith("impl.lock")]
    assert check(events, good_final()).results["INV-4"].valid is True
    events = [e for e in events if not e["kind"].startswith("impl.")]
    assert check(events, good_final()).results["INV-4"].valid == UNKNOWN


# -- INV-5 honest readiness --------------------------------------------------------------------

MARKER_SEEN = {"attached": False, "size": 26, "same_bytes": False, "loader": f"{JAIL}/{NVML}: file too short"}


def test_inv5_fails_when_the_first_probe_after_ready_is_bad():
    h = History()
    ready = h.ready_worker(0.0, "A")
    bad = h.probe(0.1, "A", **{NVML: MARKER_SEEN})
    v = check(h.events, good_final())
    assert v.valid is False and v.invariant == "INV-5"
    assert v.results["INV-1"].valid is True
    assert v.first_violation is bad and v.chain == [ready]
    assert v.explanation == (f"worker A reported ready at t=0.041s but its first probe at t=0.100s shows {NVML}: "
                             "mount detached, 26-byte file that is not the host file (a placeholder); "
                             "loader says: file too short")


def test_inv5_passes_when_the_first_probe_is_intact():
    h = History()
    h.ready_worker(0.0, "A")
    h.probe(0.1, "A")
    assert check(h.events, good_final()).results["INV-5"].valid is True


def test_inv5_loss_after_ready_is_inv1():
    """First probe already bad, but another node removed the file after A became ready: A was
    honest and lost it later (INV-1, with the chain)."""
    h = History()
    h.ready_worker(0.0, "A")
    h.failing_cli(0.1, "B", [NVML])
    h.probe(0.2, "A", **{NVML: detached()})
    v = check(h.events, good_final(transient_only=False))
    assert v.invariant == "INV-1" and v.results["INV-5"].valid is True
    assert [e["kind"] for e in v.chain] == ["failpoint", "cli.fail", "cli.cleanup.unlink"]


@pytest.mark.parametrize("began, blamed", [(0.1055, "INV-1"), (0.1065, "INV-5")])
def test_an_unlink_written_after_the_probe_it_hurt_is_still_its_cause(began, blamed):
    """An event is written after its system call: B's unlink, begun before A's first probe ended but
    written 1 ms after it, is what that probe saw (A was honest and lost the file: INV-1). One that
    began after the probe ended cannot have hurt it (INV-5, A was ready without the file)."""
    h = History()
    h.ready_worker(0.0, "A")
    h.failing_cli(0.1, "B", [NVML])   # its unlink written at t=0.106
    h.events[-2]["began"] = T0 + began
    placeholder = {"attached": False, "size": 0, "same_bytes": False}
    h.probe(0.106 - 0.0001, "A", **{NVML: placeholder})
    h.probe(0.2, "A", **{NVML: placeholder})   # probed after the unlink too: evidence enough
    v = check(h.events, good_final(transient_only=False))
    assert v.invariant == blamed
    assert v.results["INV-1" if blamed == "INV-5" else "INV-5"].valid is True


def test_lookup_results_say_what_the_loader_found():
    """A soname looked up through the jail's linker cache (node_probes.py probe_lookup) is judged like a
    file, under its own name, and the explanation says where the lookup led, or that it found
    nothing."""
    h = History()
    h.ready_worker(0.0, "A")
    nvml_cache = {"path": f"{JAIL}/ld.so.cache(libnvidia-ml.so.1)", "lookup": "libnvidia-ml.so.1", "attached": False,
                  "size": 26, "same_bytes": False, "loader": f"{JAIL}/{LIB}/libnvidia-ml.so.1: file too short",
                  "resolved": f"cache: /{LIB}/libnvidia-ml.so.1"}
    nvml_dlopen = {"path": f"{JAIL}/dlopen(libnvidia-ml.so.1)", "lookup": "libnvidia-ml.so.1", "attached": False,
                   "size": None, "loader": "libnvidia-ml.so.1: cannot open shared object file: No such file or directory"}
    h.add(0.1, "A", "probe", results=[nvml_cache, nvml_dlopen])
    v = check(h.events, good_final())
    assert v.invariant == "INV-5"
    assert [x.explanation.split(" shows ", 1)[1] for x in v.results["INV-5"].violations] == [
        f"ld.so.cache(libnvidia-ml.so.1): the lookup gave cache: /{LIB}/libnvidia-ml.so.1, mount detached, "
        "26-byte file that is not the host file (a placeholder); loader says: file too short",
        "dlopen(libnvidia-ml.so.1): nothing loaded; loader says: cannot open shared object file: No such file or directory"]


# -- INV-6 no host residue ---------------------------------------------------------------------

def test_inv6_fails_on_leftovers():
    v = check(good_run().events, good_final(host_mounts=[f"{JAIL}/{NVML}"], processes=[4242],
                                            temp_dirs=["/tmp/gpujail-1", "/tmp/gpujail-2"]))
    r = v.results["INV-6"]
    assert r.valid is False and v.invariant == "INV-6" and v.first_violation is None
    assert [x.explanation for x in r.violations] == [
        f"host residue: 1 mount of the run left in the host namespace: {JAIL}/{NVML}",
        "host residue: 1 process left running: 4242",
        "host residue: 2 temporary directories left: /tmp/gpujail-1, /tmp/gpujail-2"]
    assert v.explanation == r.violations[0].explanation


def test_inv6_passes_when_clean():
    assert check(good_run().events, good_final()).results["INV-6"].valid is True


# -- missing data ------------------------------------------------------------------------------

def test_missing_final_state_is_unknown_not_a_pass():
    v = check(good_run().events, {})
    assert v.valid == UNKNOWN
    assert statuses(v) == {"INV-1": "PASS", "INV-2": "UNKNOWN", "INV-3": "UNKNOWN", "INV-4": "PASS",
                           "INV-5": "PASS", "INV-6": "UNKNOWN"}
    assert v.summary().splitlines()[0] == "verdict: UNKNOWN"
    assert "final_state has no transient_only" in v.results["INV-2"].note


def test_partly_missing_data_is_unknown():
    final = good_final()
    del final["temp_dirs"], final["outside_changes"]
    v = check(good_run().events, final)
    assert v.results["INV-6"].valid == UNKNOWN and "temp_dirs" in v.results["INV-6"].note
    assert v.results["INV-3"].valid == UNKNOWN


def test_no_probes_is_unknown():
    h = good_run()
    v = check([e for e in h.events if e["kind"] != "probe"], good_final())
    assert v.results["INV-1"].valid == UNKNOWN and v.results["INV-5"].valid == UNKNOWN
    assert check([], good_final()).valid == UNKNOWN


def test_a_violation_outweighs_missing_data():
    h = History()
    h.ready_worker(0.0, "A")
    h.probe(0.06, "A")
    h.failing_cli(0.3, "B", [NVML])
    h.probe(0.4, "A", **{NVML: detached()})
    assert check(h.events, None).valid is False


# -- the command line --------------------------------------------------------------------------

def test_command_line(tmp_path, capsys):
    h = History()
    h.ready_worker(0.0, "A")
    h.probe(0.06, "A")
    h.failing_cli(0.3, "B", [NVML])
    h.probe(0.4, "A", **{NVML: detached()})
    hist, final = tmp_path / "history.jsonl", tmp_path / "final.json"
    hist.write_text("".join(json.dumps(e) + "\n" for e in h.events))
    final.write_text(json.dumps(good_final(transient_only=False)))
    assert checker.main([str(hist), str(final), "--timeline", str(tmp_path / "t.html")]) == 1
    out = capsys.readouterr().out
    assert out.startswith("verdict: INVALID (INV-1)") and f"worker A lost {NVML}" in out
    assert (tmp_path / "t.html").read_text().count("<svg") == 1
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps(e) + "\n" for e in good_run().events))
    assert checker.main([str(good), str(final)]) == EXIT["passed"]
    assert checker.main([str(good)]) == EXIT["inconclusive"]    # no final state: not a pass, not bad input


def test_command_line_bad_input_is_not_unknown(tmp_path, capsys):
    """Bad input exits 2 (EXIT["bad-input"]), never 4 (a verdict of UNKNOWN), and says where."""
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps(e) + "\n" for e in good_run().events))
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(good_run().events[0]) + "\n{not json\n")
    final = tmp_path / "final.json"
    final.write_text("[1, 2]")
    assert checker.main([str(tmp_path / "missing.jsonl")]) == EXIT["bad-input"]
    assert "cannot read the history" in capsys.readouterr().err
    assert checker.main([str(broken)]) == EXIT["bad-input"]
    assert f"{broken}:2: not JSON" in capsys.readouterr().err
    assert checker.main([str(good), str(final)]) == EXIT["bad-input"]
    assert "expected a JSON object, found list" in capsys.readouterr().err
    assert checker.main([str(good), "--no-such-option"]) == EXIT["bad-input"]
    odd = tmp_path / "odd.jsonl"
    odd.write_text(json.dumps({"t": 1.0, "node": "A", "pid": 1, "kind": "worker.ready"}) + "\n")
    assert checker.main([str(odd), "--strict"]) == EXIT["bad-input"]    # attempt is required
    assert "field 'attempt': missing" in capsys.readouterr().err
    assert checker.main([str(good), "--strict", str(tmp_path / "nofinal.json")]) == EXIT["bad-input"]


@pytest.mark.parametrize("loader,says", [
    (f"{JAIL}/{NVML}: file too short", "file too short"),
    ("libnvidia-ml.so.1: cannot open shared object file: No such file or directory",
     "libnvidia-ml.so.1: cannot open shared object file: No such file or directory"),
    ("ok", None), (None, None)])
def test_loader_says(loader, says):
    assert checker.loader_says({"loader": loader}) == says


# -- checkers compose (Jepsen's check-safe and compose) ----------------------------------------

def test_a_checker_that_raises_is_unknown_for_its_invariant_only():
    """A broken checker makes its own invariant UNKNOWN, with the exception and where it was
    raised as the reason; every other invariant is still judged, and a violation found by another
    still makes the verdict INVALID."""
    def broken(run):
        raise KeyError("size")
    h = History()
    h.ready_worker(0.0, "A")
    h.probe(0.06, "A")
    h.failing_cli(0.3, "B", [NVML])
    bad = h.probe(0.4, "A", **{NVML: detached()})
    final = good_final(transient_only=False)
    verdict = check(h.events, final, checkers={**checker.CHECKERS, "INV-3": broken})
    r = verdict.results["INV-3"]
    assert r.valid == UNKNOWN and r.note.startswith("checker raised KeyError: 'size' (at ")
    assert "in broken" in r.note and "test_checker.py" in r.note
    assert statuses(verdict) == {"INV-1": "FAIL", "INV-2": "PASS", "INV-3": "UNKNOWN", "INV-4": "PASS",
                                 "INV-5": "PASS", "INV-6": "PASS"}
    assert verdict.valid is False and verdict.first_violation is bad
    # On a good run the same broken checker leaves the verdict UNKNOWN, and says why.
    good = check(good_run().events, good_final(), checkers={**checker.CHECKERS, "INV-3": broken})
    assert good.valid == UNKNOWN and good.reason.startswith("INV-3: checker raised KeyError")
    line = next(ln for ln in good.summary().splitlines() if ln.startswith("  INV-3 "))
    assert line.split()[3:6] == ["UNKNOWN", "checker", "raised"]
    assert good.to_dict()["reason"] == good.reason


@pytest.mark.parametrize("returned,reason", [
    (None, "checker returned NoneType, not an InvariantResult"),
    (InvariantResult("X", "maybe"), "checker returned valid='maybe' (expected True, False or 'unknown')"),
    (InvariantResult("X", UNKNOWN), "the checker gave no reason")])
def test_unknown_always_carries_a_reason(returned, reason):
    verdict = check(good_run().events, good_final(), checkers={"MY-1": lambda run: returned})
    assert verdict.valid == UNKNOWN and verdict.results["MY-1"].note == reason
    assert verdict.reason == f"MY-1: {reason}"


def test_a_fail_without_violations_gets_one():
    verdict = check(good_run().events, good_final(), checkers={"MY-1": lambda run: InvariantResult("MY-1", False, "bad")})
    assert verdict.valid is False and verdict.invariant == "MY-1" and verdict.explanation == "MY-1: bad"


def test_a_user_invariant_is_registered_and_judged():
    """`register` adds an invariant to every later check (here: no worker restarts); its
    violations are headlines like the built-in ones, and `unregister` removes it."""
    @checker.register("MY-1", description="no restarts")
    def no_restarts(run):
        restarts = run.of("worker.restart")
        return InvariantResult("MY-1", not restarts, f"{len(restarts)} restarts",
                               [Violation("MY-1", f"worker {checker.node_of(e)} restarted", e) for e in restarts])
    try:
        assert checker.CHECKERS["MY-1"] is no_restarts
        h = good_run()
        assert check(h.events, good_final()).results["MY-1"].status == "PASS"
        restart = h.add(0.7, "B", "worker.restart", pid=9000, attempt=1)
        verdict = check(h.events, good_final())
        assert verdict.valid is False and verdict.invariant == "MY-1" and verdict.first_violation is restart
        line = next(ln for ln in verdict.summary().splitlines() if ln.startswith("  MY-1 "))
        assert line.split() == ["MY-1", "no", "restarts", "FAIL", "1", "restarts"]
        assert statuses(verdict)["INV-1"] == "PASS"
    finally:
        checker.unregister("MY-1")
    assert "MY-1" not in check(good_run().events, good_final()).results
    assert list(checker.CHECKERS) == ["INV-1", "INV-2", "INV-3", "INV-4", "INV-5", "INV-6"]


def test_compose_is_a_checker_of_checkers():
    """compose(checkers)(run) is check() with exactly those checkers; none at all is UNKNOWN."""
    judge = checker.compose({"INV-1": checker.CHECKERS["INV-1"], "INV-4": checker.CHECKERS["INV-4"]})
    verdict = judge(checker.Run(good_run().events, good_final()))
    assert statuses(verdict) == {"INV-1": "PASS", "INV-4": "PASS"} and verdict.valid is True
    assert checker.compose({})(checker.Run([], None)).valid == UNKNOWN


# -- fault windows (chaos/checkers/windows.py) -------------------------------------------------------

def _window_history(failing_exit_at: float, versions: dict | None = None) -> list[dict]:
    e = lambda t, kind, node="host", **f: {"t": t, "kind": kind, "node": node, **f}  # noqa: E731
    return [e(0.0, "chaos.begin", scenario="s", impl="x", seed=0, schedule={}, versions=versions or {}),
            e(0.1, "worker.start", "w0", impl="x", attempt=1), e(0.1, "worker.start", "w1", impl="x", attempt=1),
            e(0.3, "worker.exit", "w0", code=0, error=None), e(0.3, "worker.ready", "w0", attempt=1),
            e(0.4, "probe", "w0", results=[]),
            e(failing_exit_at, "worker.exit", "w1", code=4, error="configure failed"),
            e(0.9, "chaos.end")]


def test_window_failure_while_ready_opens_only_when_a_neighbour_was_ready():
    from gpujail.chaos.checkers.queries import Run
    from gpujail.chaos.checkers.windows import opened
    assert opened("failure-while-ready", Run(_window_history(0.5), None))[0] is True
    ok, why = opened("failure-while-ready", Run(_window_history(0.2), None))
    assert ok is False and "no start failed while another worker was ready" in why
    assert opened("overlap", Run(_window_history(0.5), None))[0] is True


def test_window_other_version_needs_two_versions_ready_at_once():
    from gpujail.chaos.checkers.queries import Run
    from gpujail.chaos.checkers.windows import opened
    events = _window_history(0.5, {"w0": "550.54.15", "w1": "570.86.15"})
    events += [{"t": 0.6, "kind": "worker.ready", "node": "w1", "attempt": 2}]
    assert opened("other-version-ready", Run(events, None))[0] is True
    same = _window_history(0.5, {"w0": "550.54.15", "w1": "550.54.15"})
    same += [{"t": 0.6, "kind": "worker.ready", "node": "w1", "attempt": 2}]
    assert opened("other-version-ready", Run(same, None))[0] is False


def test_unknown_window_is_a_scenario_error(tmp_path):
    from gpujail.chaos import scenario
    p = tmp_path / "s.toml"
    p.write_text('name = "s"\nwindows = ["nosuch"]\n')
    with pytest.raises(scenario.ScenarioError, match="unknown window"):
        scenario.load(p)


SONAME = f"{LIB}/libnvidia-ml.so.1"


def soname_result(**what) -> dict:
    """A probe result for the NVML soname: intact unless `what` says otherwise."""
    return {"path": f"{JAIL}/{SONAME}", "attached": True, "size": 4096, "same_bytes": True, "loader": "ok", **what}


def test_chain_names_create_symlinks_renaming_over_a_placeholder():
    """CDI-3: `create-symlinks` renames its link over whatever is at the soname, a REF-12 marker with
    other nodes' mounts on it included (`cdi.symlink`, `replaced` a regular file: the kernel detaches
    those mounts, K-1). That rename removed the file: the chain and the explanation name it, led by
    the hook that did it; a rename over nothing or over another symlink elsewhere is no removal."""
    h = History()
    h.ready_worker(0.0, "A")
    h.probe(0.06, "A")["results"].append(soname_result())
    hook = h.add(0.3, "W", "cdi.hook", pid=7, hook="create-symlinks", root=JAIL,
                 argv=["--link", f"libnvidia-ml.so.570.86.15::/{SONAME}"])
    h.add(0.301, "W", "cdi.symlink", pid=7, path=f"/{LIB}/libcuda.so.1", target="libcuda.so.570.86.15", replaced="nothing")
    rename = h.add(0.302, "W", "cdi.symlink", pid=7, path=f"/{SONAME}", target="libnvidia-ml.so.570.86.15",
                   replaced="- 26 bytes")
    h.add(0.303, "W", "cdi.symlink", pid=7, path=f"/{LIB}/libcuda.so", target="libcuda.so.1", replaced="symlink")
    h.probe(0.5, "A")["results"].append(soname_result(attached=False, size=0, same_bytes=False,
                                                      loader=f"{JAIL}/{SONAME}: file too short"))
    v = check(h.events, good_final(transient_only=False))
    assert v.invariant == "INV-1" and v.chain == [hook, rename]
    assert v.explanation.startswith(f"worker A lost {SONAME}: mount detached")
    assert ("after worker W's create-symlinks replaced it (a 26-byte file) with a link to "
            "libnvidia-ml.so.570.86.15 at t=0.302s") in v.explanation
    assert "nothing in the history removed it" not in v.explanation


@pytest.mark.parametrize("replaced", ["symlink", "nothing"])
def test_create_symlinks_replacing_no_file_removed_nothing(replaced):
    """A `cdi.symlink` that replaced a symlink (a link flip) or nothing removed no file: it explains
    no detached mount."""
    h = History()
    h.ready_worker(0.0, "A")
    h.probe(0.06, "A")["results"].append(soname_result())
    h.add(0.3, "W", "cdi.hook", pid=7, hook="create-symlinks", root=JAIL, argv=[])
    h.add(0.302, "W", "cdi.symlink", pid=7, path=f"/{SONAME}", target="libnvidia-ml.so.570.86.15", replaced=replaced)
    h.probe(0.5, "A")["results"].append(soname_result(attached=False, size=None, error="No such file or directory"))
    v = check(h.events, good_final(transient_only=False))
    assert v.invariant == "INV-1" and v.chain == []
    assert "nothing in the history removed it" in v.explanation
