"""A CDI-mode worker start on a shared jail, black-box through the contract: SPEC CDI-1..CDI-4.

A CDI-mode implementation takes its file set from `nvidia-ctk cdi generate` (the fake,
fixtures/fake_ctk.py) instead of `nvidia-container-cli list`, and whatever it does with the spec's
mount targets (CDI-2), links (CDI-3) and linker cache (CDI-4), the jail is still shared: these tests
start it next to other nodes and judge from outside, as test_worker_start.py does. They apply only
to CDI-mode implementations, named in CDI_MODE; every other one is skipped with that reason (its
file set comes from `list`, so the spec's hazards are not its own).

Shared slots: the jail (everyone); a neighbour is the implementation under test again, or the one
another node of a half-migrated fleet runs (`legacy`: CLI-based; `reference`: REF-12 markers).
"""
from __future__ import annotations

import json
import os
import stat

import pytest

from gpujail.backends.probes import lookup_files, problems, soname_files
from gpujail.conformance.helpers import (
    CDI_MODE,
    changes,
    host_layout,
    is_cdi_mode,
    lost,
    lost_files,
    new_entries,
    not_ready,
    one_line_error,
    soname_broken,
    start_all,
)
from gpujail.fixtures import BIN, cdi_spec, drivers
from gpujail.fixtures import jail as jail_image
from gpujail.spec import FLAG, LDCONFIG_LOCK, LOCK

pytestmark = pytest.mark.kernel
# CDI_MODE: the bundled CDI-mode implementations. Any other implementation (a vendor's command) is
# CDI-mode when the run brings a CDI spec (`--cdi-spec FILE`, fixtures/cdi_spec.py): then its nodes
# serve the driver that spec describes, the fake `nvidia-ctk cdi generate` prints that spec, and these
# tests run against it with the probes checking the spec's mounts (helpers.is_cdi_mode).
OLD, NEW = drivers.VERSIONS[0], drivers.VERSIONS[1]   # a rolling driver upgrade: 550 then 570
CONF_DIR = "etc/ld.so.conf.d/"
EMPTY_BY_DESIGN = (LOCK, LDCONFIG_LOCK, FLAG)   # 0-byte files of the procedure itself, never mount targets


@pytest.fixture(autouse=True)
def cdi_mode(impl):
    if not is_cdi_mode(impl):
        pytest.skip(f"{impl!r} is not a CDI-mode implementation (its file set comes from `nvidia-container-cli list`, "
                    f"not a CDI spec); the CDI-* tests apply to {', '.join(CDI_MODE)}, or to any implementation "
                    "run with --cdi-spec FILE")


def driver_of(version: str) -> str:
    """The driver version a node started on `version` serves: the vendor's with --cdi-spec (it stands
    in for the default fixture driver), else `version` itself."""
    vendor = cdi_spec.for_node(version)
    return vendor.version if vendor is not None else version


@pytest.mark.req("CDI-1", "REF-7")
def test_every_file_the_spec_names_is_mounted_at_its_container_path(world):
    """CDI-1: the spec's mounts keep the host path (driver root stripped, not flattened). After a
    start, a GPU job on the worker sees every file the spec names (libraries, binaries, firmware) at
    its `containerPath` in the jail, attached, with the host file's bytes; IPC sockets aside."""
    w = world.start("w")
    assert w.ready, not_ready("CDI-1", w)
    r = w.node.run([str(BIN / "nvidia-ctk"), "cdi", "generate", "--format=json"])
    assert r.code == 0, f"CDI-1: `nvidia-ctk cdi generate` failed on worker {w.node_id}: {r.stderr.strip()}"
    mounts = [m for m in json.loads(r.stdout)["containerEdits"]["mounts"] if not m["hostPath"].endswith("/socket")]
    vendor = cdi_spec.active()
    if vendor is not None:   # --cdi-spec: the fake printed the vendor's spec, whatever its size
        assert len(mounts) == len([m for m in vendor.spec["containerEdits"].get("mounts", [])
                                   if not m["hostPath"].endswith("/socket")]), \
            f"CDI-1 (precondition): the fake nvidia-ctk did not print the vendor's spec {vendor.path}"
    else:
        assert len(mounts) >= 10, f"CDI-1: the spec names {len(mounts)} files, expected the driver's libraries and more"
    results = w.node.probe([{"path": f"{world.jail}{m['containerPath']}", "host": m["hostPath"],
                             "load": ".so." in m["containerPath"]} for m in mounts])
    assert (gone := problems(results)) == [], lost_files("CDI-1", w, gone, world.jail)


@pytest.mark.req("CDI-1", "REF-1", "REF-10")
def test_failing_generate_is_fatal(world):
    """REF-1 where the file set is a CDI spec: a failing `nvidia-ctk cdi generate` (the fake's
    failpoint `cdi.before_generate`, EIO) is fatal, with one error line naming it, before anything is
    written to the jail: no marker, no mount target, no done flag (REF-10)."""
    before = jail_image.snapshot(world.jail)
    w = world.start("w", env={"GPUJAIL_FAILPOINTS": "cdi.before_generate=return(EIO)"})
    assert not w.ready, f"REF-1: worker {w.node_id} became ready (exit 0) although `nvidia-ctk cdi generate` failed (EIO)"
    assert "generate" in (line := one_line_error(w, "REF-1")), \
        f"REF-1: worker {w.node_id}'s error line does not name the failing `nvidia-ctk cdi generate`: {line!r}"
    after = jail_image.snapshot(world.jail)
    assert after == before, \
        f"REF-1: worker {w.node_id} wrote to the jail although `nvidia-ctk cdi generate` failed: {changes(before, after)}"


@pytest.mark.req("CDI-1", "REF-12", "REF-8")
def test_a_job_loads_the_driver_by_soname_from_a_rhel_hosts_spec(world):
    """CDI-1: on a RHEL host the spec mounts the libraries at /usr/lib64/... (the host path, not
    flattened), a directory a Debian jail's linker neither lists in its etc/ld.so.conf nor searches
    by default (a runtime's update-ldcache adds a conf file for it, CDI-4). Whatever the
    implementation does about that, a GPU job on a ready worker must load each driver library by its
    soname (libnvidia-ml.so.1, libcuda.so.1, ...) as its loader does: through the jail's
    etc/ld.so.cache or the loader's default directories, and get this node's own driver (REF-12, and
    REF-8's "libnvidia-ml.so.1 must resolve to real content")."""
    options = host_layout(world, "rhel")
    w = world.start("w", **options)
    assert w.ready, not_ready("CDI-1 (a RHEL host)", w)
    asked = lookup_files(world.jail, layout="rhel")
    results = w.node.probe(asked)
    assert len(results) == len(asked) >= 4, f"CDI-1 (precondition): {len(results)} lookup results of {len(asked)}"
    bad = [r for r in results if r.get("loader") != "ok" or r.get("same_bytes") is False]
    says = bad and (bad[0].get("loader") or bad[0].get("error") or "?").split(": ", 1)[-1]
    assert bad == [], (f"CDI-1/REF-12: on a RHEL host, a GPU job on worker {w.node_id} cannot load "
                       f"{len({r['lookup'] for r in bad})} driver libraries by soname, e.g. {bad[0]['lookup']} "
                       f"({bad[0].get('resolved') or ''}): {says}")


@pytest.mark.req("CDI-2", "REF-5")
def test_cli_neighbours_cleanup_costs_a_cdi_worker_nothing(world):
    """CDI-2: a runtime creates each missing mount target as an empty file and never removes it; a
    failing CLI's cleanup (CLI-6) unlinks every 0-byte file among its targets. In a fleet half
    migrated, a CDI worker is ready, then a node still running `legacy` starts and its CLI fails
    after 10 mounts: the CDI worker must keep every driver file. The jail may gain only complete
    markers (REF-5), never a 0-byte target."""
    before = jail_image.snapshot(world.jail)
    w = world.start("w")
    assert w.ready, not_ready("CDI-2", w)
    empty = sorted(rel for rel, (mode, size, _) in new_entries(before, world.jail, "CDI-2").items()
                   if stat.S_ISREG(mode) and size == 0 and rel not in EMPTY_BY_DESIGN)
    cli = world.start("cli", impl="legacy", env={"GPUJAIL_FAILPOINTS": "cli.before_mount=10*off->return(EIO)"})
    assert not cli.ready, "CDI-2 (precondition): the legacy neighbour's CLI was to fail after 10 mounts and did not"
    assert (gone := lost(w, world.jail)) == [], \
        lost_files("CDI-2 (after a legacy neighbour's CLI failed and cleaned up)", w, gone, world.jail)
    assert empty == [], (f"CDI-2: worker {w.node_id} left {len(empty)} 0-byte mount target(s) in the jail, which a CLI "
                         f"neighbour's cleanup unlinks from under its mounts: {', '.join(empty[:5])}")


@pytest.mark.req("CDI-3", "REF-12")
@pytest.mark.parametrize("neighbour", ["same", "reference"])
def test_a_node_on_another_driver_leaves_each_node_its_own_sonames(world, impl, neighbour):
    """CDI-3: `create-symlinks` replaces whatever is at each soname link, a marker with other nodes'
    mounts on it included. A node on driver 550 (the implementation under test, or a `reference`
    node with its REF-12 soname mounts) is ready; then a node of the implementation under test on
    570 starts. Each ready node's sonames (libnvidia-ml.so.1, libcuda.so.1, ...) must still load its
    own driver: neither a link flipped to the other version nor a mount detached from under it."""
    if driver_of(OLD) == NEW:
        pytest.skip(f"the --cdi-spec driver is {NEW}, the fixture driver of the second node: the two nodes' "
                    "libraries carry one version, so a flipped link could not be told from a kept one")
    first = world.start("w0", version=OLD, impl=impl if neighbour == "same" else neighbour)
    assert first.ready, not_ready(f"CDI-3 ({neighbour} node on {OLD})", first)
    second = world.start("w1", version=NEW)
    assert second.ready, not_ready(f"CDI-3 (node on {NEW} after one on {OLD})", second)
    for w, version in ((first, OLD), (second, NEW)):
        for r in w.node.probe(soname_files(world.jail, version)):
            assert r.get("loader") == "ok" and r.get("driver") == driver_of(version), (
                soname_broken("CDI-3", w, r) + f"; driver {r.get('driver')}, its own is {driver_of(version)}"
                + ("" if w is second else f" (after {second.node_id} on {NEW} started)"))


@pytest.mark.req("CDI-4", "REF-4")
def test_warm_start_leaves_the_linker_cache_and_its_configuration_alone(world):
    """CDI-4: `update-ldcache` adds ld.so.conf.d files and rewrites the shared etc/ld.so.cache on
    every start. On a warm jail (another worker brought it up) a start writes nothing (REF-4):
    no new configuration file, the cache not replaced (same inode), nothing else changed."""
    first = world.start("w0")
    assert first.ready, not_ready("CDI-4", first)
    cache = world.jail / "etc/ld.so.cache"
    before, inode = jail_image.snapshot(world.jail), os.stat(cache).st_ino if cache.exists() else None
    w = world.start("w1")
    assert w.ready, not_ready("CDI-4 (warm start)", w)
    assert (changed := changes(before, jail_image.snapshot(world.jail))) == [], \
        f"CDI-4/REF-4: worker {w.node_id}'s warm start changed the jail: " + "; ".join(changed[:8])
    after = os.stat(cache).st_ino if cache.exists() else None
    assert after == inode, (f"CDI-4/REF-4: worker {w.node_id}'s warm start replaced the shared etc/ld.so.cache "
                            f"(inode {inode} became {after}): other nodes' jobs read it")


@pytest.mark.req("CDI-4")
def test_concurrent_first_starts_add_no_linker_configuration(world):
    """CDI-4: four workers start at once on a cold jail. glibc's ldconfig writes the cache through
    one fixed temporary name (etc/ld.so.cache~), so concurrent runs on the shared root fail or tear
    it, and each update-ldcache leaves a zz-nvcr-*.conf behind. Every worker must become ready at
    its first start, and the jail's etc/ld.so.conf.d must gain nothing."""
    before = jail_image.snapshot(world.jail)
    for w in start_all(world, 4):
        assert w.ready, not_ready("CDI-4 (four first starts at once)", w)
    added = sorted(rel for rel in new_entries(before, world.jail, "CDI-4") if rel.startswith(CONF_DIR))
    assert added == [], f"CDI-4: four first starts left {len(added)} file(s) in the jail's {CONF_DIR}: {', '.join(added)}"
