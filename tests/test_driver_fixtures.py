"""The driver fixtures: what each NVIDIA driver version puts on a node, and the cached tree that holds it.

The kernel backend overlays this tree on each worker's /usr, so everything the suite asserts about
"real content" rests on it: every file above 1 KiB (REF-7), libraries that the real loader loads and
the real ldconfig links by soname (K-3), different bytes per driver version (REF-1, upgrades).
"""
import os
import shutil
import stat
import subprocess
import sys

import pytest

from gpujail.fixtures import drivers, elf, nvc_info
from gpujail.fixtures.drivers import LIB32, LIB64, VERSIONS, catalogue, materialise, tree_path
from gpujail.fixtures.jail import find_ldconfig


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private driver cache, so building (and rebuilding) trees never races other tests."""
    monkeypatch.setenv("GPUJAIL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def by_kind(version):
    out = {}
    for f in catalogue(version):
        out.setdefault(f.kind, []).append(f)
    return out


@pytest.mark.parametrize("version", VERSIONS)
def test_catalogue_has_every_kind_of_driver_file(version):
    """CLI-2/CLI-3: libraries, 32-bit libraries, binaries, firmware under /lib/firmware/nvidia/<version>/,
    the persistenced socket and the device nodes, each with the full st_mode the CLI compares (CLI-4)."""
    kinds = by_kind(version)
    assert set(kinds) == {"library", "library32", "binary", "firmware", "ipc", "device"}
    paths = [f.path for f in catalogue(version)]
    assert len(paths) == len(set(paths)) and all(p.startswith("/") for p in paths)
    for f in kinds["library"]:
        assert f.path.startswith(LIB64 + "/lib") and f.path.endswith(f".so.{version}") and f.mode == 0o100644
        assert f.soname and f.soname.startswith(os.path.basename(f.path).split(".so.")[0] + ".so.")
    for f in kinds["library32"]:
        assert f.path.startswith(LIB32 + "/lib") and f.path.endswith(f".so.{version}") and f.mode == 0o100644
    assert {os.path.basename(f.path) for f in kinds["library32"]} < {os.path.basename(f.path) for f in kinds["library"]}
    assert all(f.path.startswith("/usr/bin/nvidia-") and f.mode == 0o100755 for f in kinds["binary"])
    assert sorted(f.path for f in kinds["firmware"]) == [f"/lib/firmware/nvidia/{version}/gsp_ga10x.bin",
                                                         f"/lib/firmware/nvidia/{version}/gsp_tu10x.bin"]
    assert all(f.mode == 0o100444 for f in kinds["firmware"])   # read-only on real hosts (REF-5 copies it)
    [sock] = kinds["ipc"]
    assert sock.path == "/run/nvidia-persistenced/socket" and stat.S_ISSOCK(sock.mode)
    devices = {f.path: f.device for f in kinds["device"]}
    assert devices == {"/dev/nvidiactl": (195, 255), "/dev/nvidia-uvm": (510, 0), "/dev/nvidia-uvm-tools": (510, 1),
                       "/dev/nvidia-modeset": (195, 254), "/dev/nvidia0": (195, 0), "/dev/nvidia1": (195, 1)}
    assert all(stat.S_ISCHR(f.mode) for f in kinds["device"])
    assert "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so." + version in paths


def test_versions_differ_in_their_file_sets():
    """REF-1: a driver upgrade changes the file set (570 adds libnvidia-gpucomp), which `list` must pick up."""
    names = {v: {os.path.basename(f.path).split(".so.")[0] for f in catalogue(v) if f.kind == "library"}
             for v in VERSIONS}
    assert names["570.86.15"] - names["550.54.15"] == {"libnvidia-gpucomp", "libnvidia-allocator"}
    assert names["550.54.15"] < names["570.86.15"]
    with pytest.raises(ValueError, match="unknown driver version"):
        catalogue("535.104.05")


@pytest.mark.parametrize("version", VERSIONS)
def test_library_capabilities_follow_the_clis_own_lists(version):
    """CLI-2: a library's capability is the CLI list (nvc_info.c) that mounts it, so "what configure
    --compute mounts" can be read off the catalogue."""
    for f in catalogue(version):
        if f.kind in ("library", "library32"):
            name = os.path.basename(f.path).split(".so.")[0]
            assert name in nvc_info.LIBRARIES[f.capability], (f.path, f.capability)


@pytest.mark.parametrize("version", VERSIONS)
def test_materialised_tree_holds_exactly_the_on_disk_files(cache, version):
    """REF-7/K-3: the tree holds every on-disk file (not devices, not the socket) at its host path (host
    symlinks such as /lib -> usr/lib resolved), with the catalogue's mode, each above 1 KiB."""
    tree = materialise(version)
    assert tree.is_dir() and tree.parent == cache / "drivers"
    on_disk = [f for f in catalogue(version) if f.on_disk]
    assert {f.kind for f in on_disk} == {"library", "library32", "binary", "firmware"}
    files = {str(p.relative_to(tree)) for p in tree.rglob("*") if not p.is_dir()}
    assert files == {tree_path(f) for f in on_disk}
    for f in on_disk:
        st = os.lstat(tree / tree_path(f))
        assert stat.S_ISREG(st.st_mode) and st.st_mode == f.mode, f.path
        assert st.st_size > 1024, f.path
        assert (tree / tree_path(f)).read_bytes() == drivers.content(f, version)
    fw = next(f for f in on_disk if f.kind == "firmware")
    assert tree_path(fw) == os.path.realpath(os.path.dirname(fw.path)).lstrip("/") + "/" + os.path.basename(fw.path)


def test_materialise_is_cached(cache):
    """Section 8 (kernel backend): the tree is built once per catalogue/generator version; a second call
    returns the same path without rebuilding (mtimes unchanged), and no half-built temporary tree is left
    behind (INV-6)."""
    first = materialise()
    lib = first / tree_path(next(f for f in catalogue() if f.kind == "library"))
    stamps = (first.stat().st_mtime_ns, lib.stat().st_mtime_ns, lib.stat().st_ino)
    second = materialise()
    assert second == first
    assert (second.stat().st_mtime_ns, lib.stat().st_mtime_ns, lib.stat().st_ino) == stamps
    assert [p.name for p in (cache / "drivers").iterdir()] == [first.name]


_LOAD = """
import ctypes, sys

for path in sys.argv[1:]:
    try:
        ctypes.CDLL(path)
        print("ok")
    except OSError as e:
        print(e)
"""


@pytest.mark.parametrize("version", VERSIONS)
def test_libraries_load_with_the_real_loader(cache, version):
    """K-3: every 64-bit library loads with ctypes.CDLL (in a fresh process, so nothing stays mapped);
    32-bit ones are refused only for their ELF class."""
    tree = materialise(version)
    kinds = by_kind(version)
    libs = [str(tree / tree_path(f)) for f in kinds["library"]]
    libs32 = [str(tree / tree_path(f)) for f in kinds["library32"]]
    r = subprocess.run([sys.executable, "-c", _LOAD, *libs, *libs32], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    results = r.stdout.splitlines()
    assert results[:len(libs)] == ["ok"] * len(libs)
    assert all("wrong ELF class: ELFCLASS32" in line for line in results[len(libs):]), results[len(libs):]
    for f in kinds["library"] + kinds["library32"]:
        assert elf.read_soname((tree / tree_path(f)).read_bytes()) == f.soname


@pytest.mark.parametrize("version", VERSIONS)
def test_real_ldconfig_makes_soname_links(cache, tmp_path, version):
    """K-3: the real `ldconfig -n DIR` (no cache, only this directory) creates each library's soname link
    in a copy of the tree's library directory (libnvidia-ml.so.1 -> libnvidia-ml.so.<version>)."""
    try:
        ldconfig = find_ldconfig()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    copy = tmp_path / "lib"
    shutil.copytree(materialise(version) / LIB64.lstrip("/"), copy)
    r = subprocess.run([ldconfig, "-n", str(copy)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert os.readlink(copy / "libnvidia-ml.so.1") == f"libnvidia-ml.so.{version}"
    assert os.readlink(copy / "libcuda.so.1") == f"libcuda.so.{version}"
    assert os.readlink(copy / "libnvidia-nvvm.so.4") == f"libnvidia-nvvm.so.{version}"
    assert os.readlink(copy / "libGLX_nvidia.so.0") == f"libGLX_nvidia.so.{version}"
    for f in by_kind(version)["library"]:
        if f.soname != os.path.basename(f.path):
            assert os.readlink(copy / f.soname) == os.path.basename(f.path), f.soname


def test_the_two_versions_differ_byte_wise(cache):
    """REF-1/INV-1: same file under both versions, different bytes, so "same bytes as the host file" tells
    a worker's own driver from a neighbour's."""
    old, new = (materialise(v) for v in VERSIONS)
    pairs = 0
    for f in catalogue(VERSIONS[0]):
        if not f.on_disk:
            continue
        twin = f.path.replace(VERSIONS[0], VERSIONS[1])
        g = next(x for x in catalogue(VERSIONS[1]) if x.path == twin)
        assert (old / tree_path(f)).read_bytes() != (new / tree_path(g)).read_bytes(), f.path
        pairs += 1
    assert pairs == len([f for f in catalogue(VERSIONS[0]) if f.on_disk])


def test_libraries_say_which_driver_they_are():
    """REF-12: each library exports its driver version, so a probe that loaded it by soname can
    tell a node's own driver from another node's."""
    import ctypes

    from gpujail.fixtures import drivers
    for version in drivers.VERSIONS:
        tree = drivers.materialise(version)
        lib = ctypes.CDLL(str(tree / f"usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{version}"))
        value = ctypes.string_at(ctypes.addressof(ctypes.c_char.in_dll(lib, drivers.VERSION_SYMBOL))).decode()
        assert value == version
