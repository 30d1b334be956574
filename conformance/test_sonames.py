"""The NVML soname on a driver laid out like a real one: SPEC REF-8 (and REF-12's limits).

The fixtures' driver libraries are the smallest ELF files the loader accepts: their dynamic section
(where DT_SONAME is) follows the ELF header. A real shared library keeps it near the end of the
file, in its read-write segment: libc.so.6's PT_DYNAMIC is about 1.8 MiB in, a driver's
libnvidia-ml.so similar. An implementation that reads a soname from a library's first bytes only
(as a quick ELF probe tends to) finds none on a real host, so its own soname mounts (REF-12) do not
happen for that library: one node's NVML soname then comes only from REF-8 (checked, and repaired with
the jail's ldconfig), and on two driver versions from whichever node ran ldconfig last. These tests
give nodes drivers whose NVML is laid out that way.
"""
from __future__ import annotations

import os
import shutil
import struct

import pytest

from gpujail.backends.probes import soname_files
from gpujail.conformance.helpers import not_ready, soname_broken
from gpujail.fixtures import drivers, elf

pytestmark = pytest.mark.kernel   # a node with its own driver tree (the kernel backend's overlay)
VERSION = drivers.DEFAULT_VERSION
DYNAMIC_AT = 2 << 20   # where libc.so.6 and a driver's NVML keep PT_DYNAMIC: about 2 MiB in


def dynamic_moved(data: bytes, at: int) -> bytes:
    """The fixture library `data` (elf.shared_object's layout: one PT_LOAD from offset 0, identity
    mapped) with its dynamic array copied to offset `at` and PT_DYNAMIC pointing there, the PT_LOAD
    grown to map it. The loader and ldconfig follow PT_DYNAMIC wherever it is; the old copy is dead
    bytes. Everything else (DT_SONAME's string, the symbols) stays where it was."""
    c = elf.MACHINES["x86_64"]
    ehdr = dict(zip(elf._EHDR_FIELDS, struct.unpack_from("<" + c.ehdr, data)))
    out = bytearray(data)
    phdrs = []
    for i in range(ehdr["phnum"]):
        off = ehdr["phoff"] + i * ehdr["phentsize"]
        phdrs.append((off, dict(zip(c.phdr_fields, struct.unpack_from("<" + c.phdr, data, off)))))
    [(dyn_off, dyn)] = [(o, p) for o, p in phdrs if p["type"] == elf.PT_DYNAMIC]
    [(load_off, load)] = [(o, p) for o, p in phdrs if p["type"] == elf.PT_LOAD]
    table = data[dyn["offset"]:dyn["offset"] + dyn["filesz"]]
    out = out.ljust(at, b"\0")[:at] + table
    dyn.update(offset=at, vaddr=at, paddr=at)
    load.update(filesz=len(out), memsz=len(out))
    for off, ph in ((dyn_off, dyn), (load_off, load)):
        struct.pack_into("<" + c.phdr, out, off, *(ph[f] for f in c.phdr_fields))
    return bytes(out)


def real_layout(tmp_path, version: str = VERSION) -> str:
    """A copy of driver `version`'s tree whose libnvidia-ml.so.<version> keeps its dynamic section 2 MiB in."""
    tree = tmp_path / f"driver-{version}"
    shutil.copytree(drivers.materialise(version), tree, symlinks=True)
    [f] = [f for f in drivers.catalogue(version) if f.path == f"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{version}"]
    path = tree / drivers.tree_path(f)
    data = dynamic_moved(drivers.content(f, version), DYNAMIC_AT)
    assert elf.read_soname(data) == "libnvidia-ml.so.1" and elf.read_soname(data[:65536]) is None
    path.chmod(0o644)
    path.write_bytes(data)
    return str(tree)


@pytest.fixture
def real_layout_driver(tmp_path):
    return real_layout(tmp_path)


@pytest.mark.req("REF-12")
def test_real_layout_sonames_stay_per_node_across_driver_versions(world, tmp_path):
    """Two nodes on two driver versions, each NVML laid out like a real library (DT_SONAME 2 MiB
    in): each ready worker's `libnvidia-ml.so.1` loads its own driver. An implementation that finds
    sonames by reading only a library's first bytes does no soname mounts on a real host, and the
    shared ldconfig link then points at one version only: the other node gets a marker or the
    wrong driver (the operator's #184)."""
    ws = [world.start(f"w{i}", version=v, node_options={"driver_tree": real_layout(tmp_path, v)})
          for i, v in enumerate(drivers.VERSIONS)]
    for w, v in zip(ws, drivers.VERSIONS):
        assert w.ready, not_ready(f"REF-12 (driver {v}, NVML's dynamic section 2 MiB in)", w)
        [r] = w.node.probe([{"path": str(world.jail / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"), "load": True}])
        assert r["loader"] == "ok" and r.get("driver") == v, (
            soname_broken("REF-12", w, r) + f"; driver {r.get('driver')}, its own is {v}")


@pytest.mark.req("REF-8")
def test_nvml_soname_of_a_real_layout_library_resolves(world, real_layout_driver):
    """A worker whose NVML keeps DT_SONAME 2 MiB in, on a cold jail (no soname link yet): it becomes
    ready, and a GPU job loads NVML by its soname `libnvidia-ml.so.1` and gets this node's driver.
    Whether the implementation mounts the soname itself (REF-12, reading the whole ELF) or has the
    jail's ldconfig make the link (REF-8's repair), the soname must resolve."""
    w = world.start("w", node_options={"driver_tree": real_layout_driver})
    assert w.ready, not_ready("REF-8 (NVML with its dynamic section 2 MiB in, as real libraries have)", w)
    [r] = w.node.probe([{"path": str(world.jail / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"), "load": True}])
    assert r["loader"] == "ok" and r["size"] > 1024 and r.get("driver") == VERSION, soname_broken("REF-8", w, r)


@pytest.mark.req("REF-8")
@pytest.mark.parametrize("stale", ["535.00.00", "999.00.00"], ids=["older", "newer"])
def test_stale_nvml_soname_link_is_repaired(world, real_layout_driver, stale):
    """The jail's `libnvidia-ml.so.1` is a stale ldconfig link to a library no node has any more:
    an older driver's (a jail from before an upgrade) or a newer one's (a node rolled back): a worker
    whose NVML keeps DT_SONAME 2 MiB in must not report ready with it dangling. It becomes ready and
    NVML loads by its soname. (Which way the versions compare must not matter: the link is stale
    because it leads elsewhere than this node's library.)"""
    link = world.jail / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
    os.symlink(f"libnvidia-ml.so.{stale}", link)
    w = world.start("w", node_options={"driver_tree": real_layout_driver})
    assert w.ready, not_ready(f"REF-8 (stale soname link libnvidia-ml.so.1 -> libnvidia-ml.so.{stale})", w)
    [r] = w.node.probe([{"path": str(link), "load": True}])
    assert r["loader"] == "ok" and r["size"] > 1024 and r.get("driver") == VERSION, soname_broken("REF-8", w, r)


@pytest.mark.req("REF-12")
def test_a_soname_link_to_ones_own_library_does_not_end_the_soname_mounts(world):
    """The jail holds ldconfig's links to this node's own libraries for every soname but the last
    (left there by an earlier node on the same driver that ran ldconfig, or by the jail's image):
    those need nothing. The last soname is not there yet: the worker must still give it this node's
    library (REF-12), and a GPU job loads every soname, each from this node's own driver."""
    sonames = soname_files(str(world.jail))
    assert len(sonames) >= 2, sonames
    for f in sonames[:-1]:
        os.symlink(os.path.basename(f["host"]), f["path"])
    w = world.start("w")
    assert w.ready, not_ready(f"REF-12 ({len(sonames) - 1} soname links to its own libraries already there)", w)
    for r in w.node.probe(sonames):
        assert r["loader"] == "ok" and r["size"] > 1024 and r.get("driver") == VERSION, soname_broken("REF-12", w, r)
