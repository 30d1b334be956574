"""The fake NVIDIA Container Toolkit (fixtures/fake_ctk.py, fixtures/fake_cdi_hook.py) against what its
Go source does (SPEC CDI-1, CDI-3, CDI-4; sources and commits in docs/cdi-fidelity.md).

`cdi generate` runs on the cached driver tree as `--driver-root` with a dev root of real char devices
(root only: mknod), and is checked against the shape of the toolkit's own golden spec
(cmd/nvidia-ctk/cdi/generate/generate_test.go). The hooks run in kernel-backend nodes on a fresh
jail, as a runtime runs them (state on stdin), and are judged from outside: the jail as the host
sees it, other nodes' mounts, the recorded history.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpujail.fixtures import ctk_render, drivers
from gpujail.world import history

# The fakes under test: fixtures/bin, or (scripts/oracle-killmatrix --group cdi-fakes) wrappers of them
# with one simpler behaviour each, which these tests must tell apart from the toolkit's.
BIN = Path(os.environ.get("GPUJAIL_CDI_FAKES") or Path(__file__).resolve().parents[1] / "fixtures" / "bin")
LIB = "usr/lib/x86_64-linux-gnu"
VERSION = drivers.DEFAULT_VERSION


@pytest.fixture
def dev_root(tmp_path) -> Path:
    if os.getuid() != 0:
        pytest.skip("mknod of the fake GPUs' char devices needs root")
    dev = tmp_path / "devroot" / "dev"
    dev.mkdir(parents=True)
    for name, major, minor in (("nvidiactl", 195, 255), ("nvidia-uvm", 510, 0), ("nvidia0", 195, 0), ("nvidia1", 195, 1)):
        os.mknod(dev / name, 0o020666, os.makedev(major, minor))
        os.chmod(dev / name, 0o666)
    return dev.parent


def generate(dev_root: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    tree = drivers.materialise(VERSION)
    return subprocess.run([str(BIN / "nvidia-ctk"), "cdi", "generate", f"--driver-root={tree}", f"--dev-root={dev_root}",
                           *args], capture_output=True, text=True, env={**os.environ, **(env or {})})


def test_generate_json_spec_shape(dev_root):
    """CDI-1: cdiVersion 0.5.0, kind nvidia.com/gpu, devices by index and UUID plus `all`, common env,
    device nodes, mounts with the driver root stripped (not flattened) and the toolkit's options, and
    the createContainer hooks in the toolkit's order."""
    r = generate(dev_root, "--format=json")
    assert r.returncode == 0, r.stderr
    spec = json.loads(r.stdout)
    tree = str(drivers.materialise(VERSION))
    assert (spec["cdiVersion"], spec["kind"]) == ("0.5.0", "nvidia.com/gpu")
    assert [d["name"] for d in spec["devices"]] == ["0", "1", "GPU-00000000-fa4e-4c1d-8000-000000000000",
                                                     "GPU-00000001-fa4e-4c1d-8000-000000000001", "all"]
    common = spec["containerEdits"]
    assert list(common) == ["env", "deviceNodes", "hooks", "mounts"]   # specs-go's field order
    assert common["env"] == [f"NVIDIA_CTK_LIBCUDA_DIR=/{LIB}", "NVIDIA_VISIBLE_DEVICES=void"]
    assert [n["path"] for n in common["deviceNodes"]] == ["/dev/nvidia-uvm", "/dev/nvidiactl"]
    assert common["deviceNodes"][1] == {"path": "/dev/nvidiactl", "hostPath": f"{dev_root}/dev/nvidiactl", "major": 195,
                                        "minor": 255, "fileMode": 0o666, "permissions": "rwm"}
    libs = {m["containerPath"]: m for m in common["mounts"] if m["containerPath"].startswith(f"/{LIB}/")}
    nvml = libs[f"/{LIB}/libnvidia-ml.so.{VERSION}"]
    assert nvml == {"hostPath": f"{tree}/{LIB}/libnvidia-ml.so.{VERSION}", "containerPath": f"/{LIB}/libnvidia-ml.so.{VERSION}",
                    "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"]}
    assert not any("i386" in m["containerPath"] for m in common["mounts"]), "nvml mode mounts 64-bit libraries only"
    hooks = [h["args"][1] for h in common["hooks"]]
    assert hooks == ["create-symlinks", "enable-cuda-compat", "update-ldcache", "disable-device-node-modification",
                     "update-application-profile"]
    links = common["hooks"][0]["args"][2:]
    assert f"libcuda.so.1::/{LIB}/libcuda.so" in links and links[0] == "--link"
    assert common["hooks"][2]["args"][2:] == ["--folder", f"/{LIB}"]
    assert all(h["hookName"] == "createContainer" and h["env"] == ["NVIDIA_CTK_DEBUG=false"] for h in common["hooks"])
    depths = [m["containerPath"].count("/") for m in common["mounts"]]
    assert depths == sorted(depths), "mounts are sorted by depth, then path (transform/sorter.go)"


def test_generate_yaml_is_yaml_v3_of_the_same_spec(dev_root):
    """CDI-1: the default YAML output is `---` then yaml.v3's block style (4-space indent, "0" quoted)
    and reads back as the JSON spec."""
    yaml = pytest.importorskip("yaml")
    as_yaml, as_json = generate(dev_root), generate(dev_root, "--format=json")
    assert as_yaml.returncode == 0, as_yaml.stderr
    assert as_yaml.stdout.startswith("---\ncdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n    - name: \"0\"\n"
                                     "      containerEdits:\n        deviceNodes:\n            - path: /dev/nvidia0\n")
    assert yaml.safe_load(as_yaml.stdout) == json.loads(as_json.stdout)
    assert "level=info msg=\"Generated CDI spec with version 0.5.0\"" in as_yaml.stderr


def test_generate_device_ids_strategies_and_hooks(dev_root, tmp_path):
    """CDI-1: --device-id selects by index or UUID, an unknown index fails as NVML does, a strategy
    names devices, --disable-hook drops a hook, --output infers the format from the extension."""
    spec = json.loads(generate(dev_root, "--format=json", "--device-id=1", "--device-name-strategy=uuid",
                               "--disable-hook=update-ldcache").stdout)
    assert [d["name"] for d in spec["devices"]] == ["GPU-00000001-fa4e-4c1d-8000-000000000001", "all"]
    assert "update-ldcache" not in [h["args"][1] for h in spec["containerEdits"]["hooks"]]
    bad = generate(dev_root, "--device-id=7")
    assert bad.returncode == 1 and "failed to get device handle from index: ERROR_INVALID_ARGUMENT" in bad.stderr
    out = tmp_path / "nvidia.json"
    assert generate(dev_root, f"--output={out}").returncode == 0
    assert json.loads(out.read_text())["cdiVersion"] == "0.5.0" and oct(out.stat().st_mode & 0o777) == "0o644"


def test_generate_soname_links_only_where_the_host_has_them(dev_root, tmp_path):
    """CDI-1: firmware at its /lib/firmware path; create-symlinks gets SONAME::DIR/SONAME for a
    library only when the host's directory holds that soname as a symlink (discover/symlinks.go
    getDotSoSymlinks), as ldconfig leaves it."""
    tree = drivers.materialise(VERSION)
    root = tmp_path / "host"
    subprocess.run(["cp", "-a", str(tree), str(root)], check=True)
    os.symlink(f"libnvidia-ml.so.{VERSION}", root / LIB / "libnvidia-ml.so.1")
    os.symlink("usr/lib", root / "lib")   # a merged-usr host: firmware is searched under /lib/firmware
    r = subprocess.run([str(BIN / "nvidia-ctk"), "cdi", "generate", "--format=json", f"--driver-root={root}",
                        f"--dev-root={dev_root}"], capture_output=True, text=True)
    spec = json.loads(r.stdout)
    firmware = [m for m in spec["containerEdits"]["mounts"] if "/firmware/" in m["containerPath"]]
    assert firmware and firmware[0]["containerPath"] == f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin", \
        "firmware keeps its unresolved host path"
    paths = [m["containerPath"] for m in spec["containerEdits"]["mounts"]]
    assert paths == sorted(paths, key=lambda p: (p.count("/"), p)) and paths[-1] == firmware[-1]["containerPath"], \
        "by depth, then path (transform/sorter.go): /lib/firmware/... is last, though it sorts first by name"
    links = spec["containerEdits"]["hooks"][0]["args"]
    assert f"libnvidia-ml.so.{VERSION}::/{LIB}/libnvidia-ml.so.1" in links
    assert not any(a.endswith("/libcudadebugger.so.1") for a in links), "no host link, no soname link"


def test_generate_soname_links_of_a_tree_ldconfig_never_ran_on(dev_root, tmp_path):
    """CDI-1, CDI-3: the fixture driver tree has no SONAME link at all (a real install always has
    them: the installer runs ldconfig), so the fake takes each one as ldconfig would have made it
    (ctk_locators.ldconfig_never_ran): libnvidia-ml.so.1 and libcuda.so.1 links, the REF-12 case of
    CDI-3. A name taken by a regular file is no link (linkExists), and no .so link is invented
    (ldconfig makes none; libcuda.so is the toolkit's own special link)."""
    tree = drivers.materialise(VERSION)
    root = tmp_path / "host"
    subprocess.run(["cp", "-a", str(tree), str(root)], check=True)
    (root / LIB / "libcudadebugger.so.1").write_bytes(b"not a link")
    r = subprocess.run([str(BIN / "nvidia-ctk"), "cdi", "generate", "--format=json", f"--driver-root={root}",
                        f"--dev-root={dev_root}"], capture_output=True, text=True)
    links = [a for a in json.loads(r.stdout)["containerEdits"]["hooks"][0]["args"] if "::" in a]
    assert f"libnvidia-ml.so.{VERSION}::/{LIB}/libnvidia-ml.so.1" in links
    assert f"libcuda.so.{VERSION}::/{LIB}/libcuda.so.1" in links
    assert not any(a.endswith("/libcudadebugger.so.1") for a in links), "a regular file is no link"
    assert not any(a.endswith("/libnvidia-ml.so") for a in links), "ldconfig makes no .so link"


def test_generate_falls_back_to_the_ld_cache_on_an_arch_host(dev_root):
    """CDI-1: on an Arch host the 64-bit libraries are in /usr/lib, which is not among the library
    locator's search paths (pkg/lookup/library.go): the toolkit finds them through the host's ld
    cache (`First(symlinkLocator, ldcacheLocator)`, pkg/lookup/ldcache.go: 64-bit entries only), so
    the spec mounts each at /usr/lib/..., the 32-bit ones in /usr/lib32 never."""
    tree = drivers.materialise(VERSION, layout="arch")
    r = subprocess.run([str(BIN / "nvidia-ctk"), "cdi", "generate", "--format=json", f"--driver-root={tree}",
                        f"--dev-root={dev_root}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    common = json.loads(r.stdout)["containerEdits"]
    libs = {m["containerPath"]: m["hostPath"] for m in common.get("mounts", []) if ".so." in m["containerPath"]}
    want = {f.path for f in drivers.catalogue(VERSION, "arch") if f.kind == "library"}
    assert set(libs) == want, f"the spec names {sorted(libs)[:3]}..., not the 64-bit libraries in /usr/lib"
    assert libs[f"/usr/lib/libnvidia-ml.so.{VERSION}"] == f"{tree}/usr/lib/libnvidia-ml.so.{VERSION}"
    assert common["env"][0] == "NVIDIA_CTK_LIBCUDA_DIR=/usr/lib"
    ldcache = next(h for h in common["hooks"] if h["args"][1] == "update-ldcache")
    assert ldcache["args"][2:] == ["--folder", "/usr/lib"]


def test_yaml_scalars_quoted_as_yaml_v3_does():
    """CDI-1: what would read back as another type is double-quoted, flags and paths stay plain."""
    assert [ctk_render._scalar(v) for v in ("0", "--link", "/dev/nvidia0", "true", "", "a: b", "550.54.15", 195)] == \
        ['"0"', "--link", "/dev/nvidia0", '"true"', '""', '"a: b"', "550.54.15", "195"]


# -- the hooks, in kernel-backend nodes ---------------------------------------------------------

def hook(node, jail, *args: str, env: dict | None = None):
    state = json.dumps({"ociVersion": "1.2.0", "id": "t", "status": "creating", "pid": 1, "bundle": "/run", "root": str(jail)})
    script = f"import subprocess,sys; sys.exit(subprocess.run(sys.argv[1:], input={state!r}, text=True).returncode)"
    return node.run([sys.executable, "-c", script, str(BIN / "nvidia-cdi-hook"), *args], env=node.contract_env(extra=env))


def mount_over(node, src: str, dst: str):
    return node.run(["mount", "--bind", src, dst])


@pytest.mark.kernel
def test_create_symlinks_replaces_a_file_other_nodes_have_mounts_on(fleet, jail, run_dir):
    """CDI-3: a LINK that is a regular file (a REF-12 soname marker) is replaced by the link: the
    rename drops the inode's name, and the kernel detaches another node's bind mount on it (K-1)."""
    marker = jail / LIB / "libnvidia-ml.so.1"
    marker.write_bytes(b"nvidia-placeholder-marker\n")
    a, b = fleet.start("a"), fleet.start("b")
    assert mount_over(a, f"/{LIB}/libnvidia-ml.so.{VERSION}", str(marker)).code == 0
    r = hook(b, jail, "create-symlinks", "--link", f"libnvidia-ml.so.{VERSION}::/{LIB}/libnvidia-ml.so.1")
    assert r.code == 0, r.stderr
    assert os.readlink(marker) == f"libnvidia-ml.so.{VERSION}"
    seen = a.run(["sh", "-c", f"grep -c ' {marker} ' /proc/self/mountinfo"]).stdout.strip()
    assert seen == "0", "the other node's mount on the replaced marker is detached"
    events = history.select(history.load(str(run_dir / "history.jsonl")), "cdi.symlink")
    assert events and events[0]["replaced"].startswith("- 26 bytes")


@pytest.mark.kernel
def test_create_symlinks_leaves_a_correct_link_and_makes_missing_dirs(fleet, jail):
    """CDI-3: a link already pointing at TARGET is left alone (same inode); a missing directory is
    created inside the root, through the jail's own symlinks (lib -> usr/lib)."""
    link = jail / LIB / "libcuda.so"
    os.symlink("libcuda.so.1", link)
    before = os.lstat(link).st_ino
    a = fleet.start("a")
    r = hook(a, jail, "create-symlinks", "--link", "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so",
             "--link", "x.so.1::/lib/newdir/x.so")
    assert r.code == 0, r.stderr
    assert os.lstat(link).st_ino == before
    assert os.readlink(jail / "usr/lib/newdir/x.so") == "x.so.1"


@pytest.mark.kernel
def test_create_symlinks_bad_spec_and_failpoint(fleet, jail):
    """CDI-3: `TARGET::LINK` is required; a failing rename (failpoint cdi.before_rename) leaves no
    temporary link behind and exits 1 with the error logged."""
    a = fleet.start("a")
    assert "invalid symlink specification" in hook(a, jail, "create-symlinks", "--link", "nolink").stderr
    r = hook(a, jail, "create-symlinks", "--link", "t::/x/l", env={"GPUJAIL_FAILPOINTS": "cdi.before_rename=return(EIO)"})
    assert r.code == 1 and "level=error" in r.stderr
    assert os.listdir(jail / "x") == []


@pytest.mark.kernel
def test_update_ldcache_rewrites_the_shared_cache_and_adds_drop_ins(fleet, jail, run_dir):
    """CDI-4: in a private namespace, pivoted into the root, update-ldcache writes a zz-nvcr-*.conf
    every run (a 00-nvcr-*.conf for folders ld.so.conf does not list) and runs the real ldconfig,
    which rewrites the root's etc/ld.so.cache and makes soname links for the node's mounts."""
    a = fleet.start("a")
    lib = jail / LIB / f"libnvidia-ml.so.{VERSION}"
    lib.touch()
    assert a.run(["mount", "--bind", str(jail), str(jail)]).code == 0   # a runtime's root is a mount point
    assert a.run(["mount", "--bind", f"/{LIB}/libnvidia-ml.so.{VERSION}", str(lib)]).code == 0
    for _ in range(2):
        r = hook(a, jail, "update-ldcache", "--folder", f"/{LIB}", "--folder", "/opt/nvidia/lib")
        assert r.code == 0, r.stderr
    confs = sorted(p.name for p in (jail / "etc/ld.so.conf.d").iterdir())
    assert len([c for c in confs if c.startswith("zz-nvcr-")]) == 2 and len([c for c in confs if c.startswith("00-nvcr-")]) == 1
    assert (jail / "etc/ld.so.cache").stat().st_size > 0
    assert os.readlink(jail / LIB / "libnvidia-ml.so.1") == f"libnvidia-ml.so.{VERSION}"
    assert not os.listdir(jail / "proc"), "the hook's /proc lived in its own namespace only"
    events = history.select(history.load(str(run_dir / "history.jsonl")), "cdi.ldconfig")
    assert events[0]["argv"] == ["ldconfig", "-f", "/etc/ld.so.conf", "-C", "/etc/ld.so.cache"]
