"""INV-3 jail hygiene with a vendor's CDI spec (`--cdi-spec FILE`, SPEC section 9): the run's own
mount targets are placeholders, whatever their names.

A CDI spec may mount driver files that are neither `lib*.so.*` nor under `lib/firmware/` or `bin/`
(`usr/share/nvidia/nvoptix.bin`, `etc/vulkan/icd.d/nvidia_icd.json`, ...). A CDI-mode implementation
puts a marker at each such target (REF-3..5) and mounts the host file over it; the jail then gains a
small file there and its parent directories. A file a worker of the run mounted a driver file on
(the `dst` of a `cli.mount` or `impl.mount` in the history) is a placeholder like a library's marker;
the same file anywhere no mount went, a real-sized file at a mount target, or a file beside a
target stays a violation. Pure tests on small histories built like tests/test_checker.py's.
"""
from __future__ import annotations

import stat

from test_checker import JAIL, REG, good_final, good_run, jail_snapshot, populated

from gpujail.chaos.checker import check

DIR = stat.S_IFDIR | 0o755
OPTIX = "usr/share/nvidia/nvoptix.bin"
ICD = "etc/vulkan/icd.d/nvidia_icd.json"


def vendor_jail(**more) -> tuple[dict, dict]:
    """Before and after a cold start whose spec also mounts OPTIX and ICD: their 26-byte markers
    and new parent directories, and `more` (path -> entry) besides."""
    before = jail_snapshot()
    after = populated(before)
    after.update({"usr/share": (DIR, 0, None), "usr/share/nvidia": (DIR, 0, None), OPTIX: (REG, 26, None),
                  "etc/vulkan": (DIR, 0, None), "etc/vulkan/icd.d": (DIR, 0, None), ICD: (REG, 26, None), **more})
    return before, after


def with_mounts(*targets: str):
    """A good run in which worker A (a CDI-mode start) also mounted the host's file over each target:
    `impl.mount` with a jail-relative `dst`, as reference_impl/direct.py records it, and B's CLI
    with an absolute one, as the fake CLI does."""
    h = good_run()
    for i, rel in enumerate(targets):
        h.add(0.031 + i / 1000, "A", "impl.mount", pid=2, src="/" + rel, dst=rel)
        h.add(0.101 + i / 1000, "B", "cli.mount", pid=4, src="/" + rel, dst=f"{JAIL}/{rel}")
    return h


def hygiene(h, before, after):
    return check(h.events, good_final(jail_before=before, jail_after=after)).results["INV-3"]


def test_markers_at_the_runs_own_mount_targets_are_placeholders():
    """The vendor spec's non-library files: a marker at each target a worker mounted over, and their
    parent directories, are what a cold start leaves (INV-3 PASS)."""
    before, after = vendor_jail()
    r = hygiene(with_mounts(OPTIX, ICD), before, after)
    assert r.valid is True, [v.explanation for v in r.violations]


def test_only_mount_targets_count_not_their_neighbours_nor_real_sized_files():
    """Not weakened for anything else: the same small file where no mount went (a stray file beside a
    target, or a target without a mount in the history), a real-sized file at a target (a copy, not a
    placeholder), and a 0-byte file a CLI created and mounted a driver file on somewhere else than
    that file's own path (a jail symlink followed out of place: hostile-links against legacy) are
    still changes INV-3 names."""
    stray, copied = "usr/share/nvidia/stray.bin", "etc/vulkan/icd.d/copied.json"
    astray = "tmp/outside/550.54.15/gsp_ga10x.bin"
    before, after = vendor_jail(**{stray: (REG, 26, None), copied: (REG, 4096, None), "tmp": (DIR, 0, None),
                                   "tmp/outside": (DIR, 0, None), "tmp/outside/550.54.15": (DIR, 0, None),
                                   astray: (stat.S_IFREG | 0o444, 0, None)})
    before["tmp"] = (DIR, 0, None)
    h = with_mounts(OPTIX, copied)
    h.add(0.12, "B", "cli.mount", pid=4, src="/lib/firmware/nvidia/550.54.15/gsp_ga10x.bin", dst=f"{JAIL}/{astray}")
    r = hygiene(h, before, after)
    texts = sorted(v.explanation.split(";")[0] for v in r.violations)
    appeared = "appeared (a {}, not a placeholder, lock, flag or ldconfig output)".format
    assert r.valid is False
    assert texts == sorted([f"jail hygiene: etc/vulkan {appeared('directory 755')}",   # no placeholder under it
                            f"jail hygiene: {copied} {appeared('4096-byte file 644')}",
                            f"jail hygiene: {ICD} {appeared('26-byte file 644')}",
                            f"jail hygiene: etc/vulkan/icd.d {appeared('directory 755')}",
                            f"jail hygiene: {stray} {appeared('26-byte file 644')}",
                            f"jail hygiene: tmp/outside {appeared('directory 755')}",
                            f"jail hygiene: tmp/outside/550.54.15 {appeared('directory 755')}",
                            f"jail hygiene: {astray} {appeared('0-byte file 444')}"])


def test_a_pre_existing_marker_at_a_mount_target_may_be_filled_in_place():
    """An old 0-byte placeholder at a mount target (a jail brought up before, REF-3) that became a
    marker is a difference by placeholders; the same at a path no mount went is not."""
    before, after = vendor_jail()
    before.update({"usr/share": (DIR, 0, None), "usr/share/nvidia": (DIR, 0, None), OPTIX: (REG, 0, None)})
    before["usr/share/nvidia/other.bin"] = (REG, 0, None)
    after["usr/share/nvidia/other.bin"] = (REG, 26, None)
    r = hygiene(with_mounts(OPTIX, ICD), before, after)
    assert [v.explanation.split(";")[0] for v in r.violations] == [
        "jail hygiene: usr/share/nvidia/other.bin changed from a 0-byte file 644 to a 26-byte file 644"]
