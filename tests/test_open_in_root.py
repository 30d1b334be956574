"""SPEC REF-11's fallback: `sysops.open_in_root`, openat2(RESOLVE_IN_ROOT) done by hand, resolves
exactly as the kernel's openat2 does on a hostile jail, and the bundled implementations use it where
openat2 is refused (a seccomp filter answering ENOSYS: fixtures/bin/gpujail-no-openat2)."""
from __future__ import annotations

import ctypes
import errno
import json
import os
import subprocess
import sys

import pytest

from gpujail.fixtures import BIN
from gpujail.world.sysops import O_PATH, RESOLVE_IN_ROOT, RealSys, open_in_root

pytestmark = pytest.mark.unprivileged

# (name, symlink target) of a jail that tries to lead out: absolute links, `..` past the root,
# chains, a loop, a dangling link, a link to a file used as a directory.
LINKS = [("lib", "usr/lib"), ("abs", "/etc"), ("up", "../../../../outside"), ("usr/lib/up2", "../../.."),
         ("chain1", "chain2"), ("chain2", "/usr/./lib/../lib"), ("loop1", "loop2"), ("loop2", "loop1"),
         ("dangling", "/nowhere/file"), ("filelink", "etc/passwd"), ("deep", "usr/lib/up2/abs/../lib")]
PATHS = ["", ".", "..", "etc", "etc/passwd", "abs", "abs/passwd", "up", "up/secret", "usr/lib/up2/etc", "chain1",
         "chain1/x", "loop1", "loop1/x", "dangling", "filelink", "filelink/x", "deep", "lib/../../..",
         "usr/lib/../../../etc/passwd", "lib/new", "dangling", "abs/new", "up/new", "missing/new"]
FLAGS = {"path": O_PATH, "path-nofollow": O_PATH | os.O_NOFOLLOW, "dir": O_PATH | os.O_DIRECTORY,
         "create": os.O_WRONLY | os.O_CREAT, "create-nofollow": os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW,
         "create-excl": os.O_WRONLY | os.O_CREAT | os.O_EXCL}


def hostile_jail(top):
    """`top/jail` and a file outside it, `top/outside/secret`, that no resolution may reach."""
    jail = top / "jail"
    for d in ("etc", "usr/lib", "nowhere"):
        (jail / d).mkdir(parents=True)
    (jail / "etc/passwd").write_text("jail's\n")
    (top / "outside").mkdir()
    (top / "outside/secret").write_text("outside\n")
    for name, target in LINKS:
        os.symlink(target, jail / name)
    return jail


def outcome(jail, resolve) -> dict:
    """Per path and flags: where the descriptor leads, relative to the jail, or the errno's name."""
    seen = {}
    for flag_name, flags in FLAGS.items():
        for rel in PATHS:
            try:
                fd = resolve(str(jail), rel, flags)
            except OSError as e:
                seen[f"{flag_name} {rel}"] = errno.errorcode[e.errno]
                continue
            where = os.readlink(f"/proc/self/fd/{fd}")
            os.close(fd)
            seen[f"{flag_name} {rel}"] = os.path.relpath(where, jail)
    return seen


def _mode(flags: int) -> int:
    return 0o644 if flags & os.O_CREAT else 0   # openat2 refuses a mode without O_CREAT (EINVAL)


def by_hand(root, rel, flags):
    rootfd = os.open(root, O_PATH | os.O_DIRECTORY)
    try:
        return open_in_root(rootfd, rel, flags, _mode(flags))
    finally:
        os.close(rootfd)


def test_by_hand_resolves_as_openat2_does(tmp_path):
    """Every path of a hostile jail, with each kind of open the implementations make: the same file
    or the same error as openat2(RESOLVE_IN_ROOT), and nothing ever outside the jail."""
    kernel, ours = hostile_jail(tmp_path / "a"), hostile_jail(tmp_path / "b")
    expected = outcome(kernel, lambda root, rel, flags: RealSys()._openat2(root, rel, flags, _mode(flags)))
    got = outcome(ours, by_hand)
    assert got == expected, {k: (got[k], expected[k]) for k in expected if got[k] != expected[k]}
    assert not any(v.startswith("..") for v in got.values()), got
    assert sorted(os.listdir(tmp_path / "b/outside")) == ["secret"]


PROBE = """
import json, os, sys
from gpujail.world.sysops import RealSys
s, root = RealSys(), sys.argv[1]
s.mkdir_beneath(root, "usr/lib/up2/made", 0o755)        # `up2` climbs past the top: stops at the jail
s.write_new_beneath(root, "abs/marker", b"m", 0o644)    # `abs` is /etc: the jail's etc
print(json.dumps([RealSys._openat2_refused, s.stat_beneath(root, "lib/../../etc/marker").st_size]))
"""


def test_bundled_sysops_fall_back_when_openat2_is_refused(tmp_path):
    """Under the seccomp filter openat2 answers ENOSYS, and RealSys's *_beneath steps walk by hand:
    the same results, inside the jail."""
    jail = hostile_jail(tmp_path)
    r = subprocess.run([str(BIN / "gpujail-no-openat2"), sys.executable, "-c", PROBE, str(jail)],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [True, 1]
    assert (jail / "made").is_dir() and (jail / "etc/marker").read_bytes() == b"m"
    assert sorted(os.listdir(tmp_path / "outside")) == ["secret"]
    assert RESOLVE_IN_ROOT   # (openat2 itself answers in this process: the first test compared with it)


def test_openat2_is_retried_when_a_dotdot_races_a_mount(tmp_path, monkeypatch):
    """openat2(RESOLVE_IN_ROOT) answers EAGAIN when a mount or rename anywhere on the host races a
    `..` it resolves ("the caller may choose to retry", openat2(2)); on a node whose neighbours mount
    (as the self-tests' other workers do) that happens. A few such answers must not fail a step:
    before, the first one was raised (seen in CI in this file's comparison with the by-hand walk)."""
    from gpujail.world import sysops
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/marker").write_text("marker\n")
    real, raced = sysops._libc, [3]

    class Racing:   # the first three openat2 calls lose the race, as under a busy host's mounts
        def syscall(self, nr, *args):
            if nr == sysops._SYS_OPENAT2 and raced[0]:
                raced[0] -= 1
                ctypes.set_errno(errno.EAGAIN)
                return -1
            return real.syscall(nr, *args)
    monkeypatch.setattr(sysops, "_libc", Racing())
    monkeypatch.setattr(RealSys, "_openat2_refused", False)
    assert RealSys().stat_beneath(str(tmp_path), "etc/../etc/marker").st_size == len("marker\n")
    assert raced == [0]
