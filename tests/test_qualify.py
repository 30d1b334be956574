"""`gpujail qualify PATH` on the three jail filesystems, each with the answer it must give, and its
bad input, its missing partner and its interruption.

Choreography: two real `gpujail qualify` processes, started together, pair up through the
rendezvous file on the shared directory and measure. On `local` both look at one directory; on
`gluster` and `nodelocal-locks` each runs in the mount namespace of its own client (a GlusterFS FUSE
client, a bindfs view: gpujail/backends/jailfs.py), entered with nsenter, as two nodes would. Shared
slot: the jail directory, which must be empty again when they are done.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from gpujail.commands.qualify import TITLES
from gpujail.spec import EXIT

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def qualify(path, *args: str, ns: str | None = None, prefix=(), **popen) -> subprocess.Popen:
    argv = [*prefix, sys.executable, "-m", "gpujail", "qualify", str(path), *args]
    if ns is not None:
        argv = ["nsenter", f"--mount={ns}", *argv]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, **popen)


def pair(path, namespaces=(None, None), prefix=()) -> list[tuple[int, str, str]]:
    """Both sides, started together; (exit code, stdout, stderr) of each."""
    procs = [qualify(path, "--timeout", "60", ns=ns, prefix=prefix) for ns in namespaces]
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=180)
            out.append((p.returncode, stdout, stderr))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def row(stdout: str, kind: str) -> str:
    """The result column of one property's row."""
    line = next(ln for ln in stdout.splitlines() if ln.startswith(TITLES[kind]))
    return re.fullmatch(r"\s+(?:yes|no)\s+(?:[\d.]+s)?\s+(.*)", line[len(TITLES[kind]):])[1]


def both_agree(results) -> tuple[int, str]:
    (code_a, out_a, err_a), (code_b, out_b, err_b) = results
    table_a, table_b = (o[o.index("gpujail qualify", 1):] for o in (out_a, out_b))
    assert table_a == table_b, f"the two sides printed different tables:\n{out_a}\n---\n{out_b}"
    assert code_a == code_b, f"exit {code_a} and {code_b}: {err_a} {err_b}"
    return code_a, out_a


def test_a_local_directory_qualifies_and_detaches_at_once(tmp_path):
    if os.getuid() != 0:
        pytest.skip("the detach check bind-mounts in a private mount namespace: root (or unshare -Urm) only")
    code, out = both_agree(pair(tmp_path))
    assert code == EXIT["passed"], out
    assert row(out, "flock") == "yes" and row(out, "posix") == "yes" and row(out, "visible") == "yes", out
    assert row(out, "excl").startswith("yes"), out
    assert row(out, "detach") == "at once (K-1)", out
    assert os.listdir(tmp_path) == [], f"qualify left {os.listdir(tmp_path)} on the shared directory"


@pytest.fixture
def jail_fs(request, tmp_path):
    """The jail filesystem of the test's parameter with one client per node, or a skip saying why
    this host cannot provide it (a failure under GPUJAIL_REQUIRE_JAILFS=1: run-tests as root)."""
    from gpujail.backends import jailfs
    reason = jailfs.unavailable(request.param)
    if reason:
        (pytest.fail if os.environ.get("GPUJAIL_REQUIRE_JAILFS") else pytest.skip)(reason)
    with jailfs.provide(request.param, tmp_path / "run", nodes=["n1", "n2"]) as fs:
        yield fs
        assert os.listdir(fs.jail) == [], f"qualify left {os.listdir(fs.jail)} on the jail"


def _nodes(fs):
    return [fs.node_options(n)["mount_ns"] for n in ("n1", "n2")]


@pytest.mark.gluster
@pytest.mark.parametrize("jail_fs", ["gluster"], indirect=True)
def test_gluster_qualifies_and_detaches_at_next_lookup(jail_fs):
    code, out = both_agree(pair(jail_fs.jail, _nodes(jail_fs)))
    assert code == EXIT["passed"], out
    assert row(out, "flock") == "yes" and row(out, "excl").startswith("yes") and row(out, "visible") == "yes", out
    assert row(out, "detach").startswith("at next lookup (K-2)") and "said ENOENT" in row(out, "detach"), out


@pytest.mark.parametrize("jail_fs", ["nodelocal-locks"], indirect=True)
def test_node_local_locks_do_not_qualify(jail_fs):
    code, out = both_agree(pair(jail_fs.jail, _nodes(jail_fs)))
    assert code == EXIT["failed"], out
    assert row(out, "flock").startswith("no:"), out
    assert "NOT safe" in out and "not: flock serialises across nodes" in out, out
    assert "O_EXCL is atomic" not in out.split("verdict:")[1], "only flock fails on bindfs views of one directory"


def test_without_a_private_mount_namespace_detachment_is_not_measured(tmp_path):
    """Without CAP_SYS_ADMIN (setpriv drops it from the bounding set) there is no namespace to
    bind-mount in: the row says so and how to get one, and the verdict does not depend on it."""
    if os.getuid() != 0:
        pytest.skip("dropping CAP_SYS_ADMIN with setpriv needs root to start from")
    code, out = both_agree(pair(tmp_path, prefix=["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin"]))
    assert code == EXIT["passed"], out
    assert row(out, "detach").startswith("not measured: no private mount namespace") and "unshare -Urm" in out, out
    assert os.listdir(tmp_path) == []


def test_no_partner_is_inconclusive_and_leaves_nothing(tmp_path):
    p = qualify(tmp_path, "--timeout", "0.5")
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == EXIT["inconclusive"], (stdout, stderr)
    assert stderr.count("\n") == 1 and "no partner came within 0.5 s" in stderr, stderr
    assert os.listdir(tmp_path) == []


def test_a_killed_leaders_rendezvous_is_taken_over_and_removed(tmp_path):
    """A leader SIGKILLed while waiting leaves its rendezvous file and run directory; once the file
    has expired, the next pair removes both and qualifies."""
    p = qualify(tmp_path, "--timeout", "1")
    assert "waiting up to 1 s" in p.stdout.readline()
    p.kill()
    p.communicate(timeout=60)
    assert len(os.listdir(tmp_path)) == 2, "the killed leader left its rendezvous file and run directory"
    time.sleep(1.1)   # not a time assertion: the killed leader's rendezvous file must have expired
    code, out = both_agree(pair(tmp_path))
    assert code == EXIT["passed"], out
    assert os.listdir(tmp_path) == [], f"left {os.listdir(tmp_path)}"


def test_a_foreign_rendezvous_file_is_bad_input(tmp_path):
    (tmp_path / ".gpujail-qualify").write_text('{"run": "../../etc", "expires": 0}')
    r = subprocess.run([sys.executable, "-m", "gpujail", "qualify", str(tmp_path), "--timeout", "5"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == EXIT["bad-input"] and "not a qualify rendezvous file" in r.stderr, r
    assert os.listdir(tmp_path) == [".gpujail-qualify"], "a file qualify did not make is left alone"


def test_an_interrupted_leader_leaves_nothing(tmp_path):
    p = qualify(tmp_path, "--timeout", "60")
    assert "waiting up to 60 s for the partner" in p.stdout.readline()
    made = sorted(os.listdir(tmp_path))
    assert len(made) == 2 and made[0] == ".gpujail-qualify", made   # the rendezvous file, the run directory
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM
    assert os.listdir(tmp_path) == [], f"left {os.listdir(tmp_path)}"


@pytest.mark.parametrize("case", ["missing", "a file", "read-only", "timeout"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, case):
    args = [str(tmp_path / "nowhere")]
    if case == "a file":
        (tmp_path / "f").write_text("")
        args = [str(tmp_path / "f")]
    elif case == "timeout":
        args = [str(tmp_path), "--timeout", "0"]
    argv = [sys.executable, "-m", "gpujail", "qualify", *args]
    if case == "read-only":
        if os.getuid() != 0:
            pytest.skip("a read-only mount in a private namespace needs root")
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                f'mount --bind -o ro "{tmp_path}" "{tmp_path}" && exec "$@"', "sh", sys.executable, "-m", "gpujail",
                "qualify", str(tmp_path)]
    r = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == EXIT["bad-input"], r
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("gpujail qualify"), r.stderr
    assert {"missing": "no such directory", "a file": "not a directory", "read-only": "not writable",
            "timeout": "--timeout 0"}[case] in r.stderr
