"""A vendor's own CDI spec, `--cdi-spec FILE` (fixtures/cdi_spec.py; issue 27 item 4): checked up front
(one line naming the file, exit 2, nothing started), read (JSON, and YAML without PyYAML), turned into
the driver files every node serving it gets, printed by the fake `nvidia-ctk cdi generate` in its
place, and what the probes check. The end-to-end runs put a spec the fake generated in a node (as a
vendor runs the real one on their host), and a hand-edited one of another driver version, through
`gpujail run --impl cdi|cdi-naive --cdi-spec FILE conformance/test_cdi.py`.
"""
from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpujail import options
from gpujail.backends import kernel, probes
from gpujail.fixtures import BIN, cdi_spec, ctk_render, drivers, elf
from gpujail.spec import EXIT

REPO = Path(__file__).resolve().parents[1]
LIB = "/usr/lib/x86_64-linux-gnu"
VERSION = drivers.DEFAULT_VERSION
OTHER = "555.42.06"   # a driver version the fixtures do not have
needs_kernel = pytest.mark.skipif(bool(kernel.precondition()), reason=str(kernel.precondition()))


@pytest.fixture(autouse=True)
def no_vendor_spec(monkeypatch, use_settings):
    """Each test starts without a vendor spec, whatever the run or the environment says."""
    monkeypatch.delenv(cdi_spec.ENV, raising=False)
    use_settings(cdi_spec="")


def generated(fmt: str = "json") -> str:
    """The spec the fake `nvidia-ctk cdi generate` writes for the fixture driver, as on a host whose
    driver is at `/` (the tree's prefix stripped from the host paths)."""
    tree = str(drivers.materialise(VERSION))
    r = subprocess.run([str(BIN / "nvidia-ctk"), "cdi", "generate", f"--driver-root={tree}", f"--format={fmt}"],
                       capture_output=True, text=True, env={k: v for k, v in os.environ.items() if k != cdi_spec.ENV})
    assert r.returncode == 0, r.stderr
    return r.stdout.replace(tree, "")


def other_version(text: str) -> str:
    """A hand edit: the same spec for another driver version, hooks at the host's /usr/bin."""
    return re.sub(r'/[^"\s]*/nvidia-cdi-hook', "/usr/bin/nvidia-cdi-hook", text.replace(VERSION, OTHER))


def write(tmp_path: Path, name: str, data) -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


# -- reading ------------------------------------------------------------------------------------

def test_the_toolkits_yaml_reads_as_its_json():
    """The fake writes yaml.v3's block style; read back without PyYAML it is the same spec as its JSON."""
    assert cdi_spec.parse_yaml(generated("yaml")) == json.loads(generated("json"))


def test_hand_edited_yaml_reads():
    """Comments, flow lists, quoted scalars, a sequence at its key's indentation, numbers, booleans."""
    text = """---
# edited by hand
cdiVersion: "0.6.0"   # quoted
kind: 'nvidia.com/gpu'
devices:
- name: all
  containerEdits:
    deviceNodes: [{}]
containerEdits:
  env: []
  mounts:
    - hostPath: /usr/bin/nvidia-smi
      containerPath: "/usr/bin/nvidia-smi"
      options: [ro, "nosuid", 'nodev']
  x: {major: 1}
"""
    with pytest.raises(cdi_spec.SpecError, match="nested flow collection"):
        cdi_spec.parse_yaml(text)
    data = cdi_spec.parse_yaml(text.replace("[{}]", "[]").replace("{major: 1}", "0o644\n  y: true\n  z: ~"))
    assert data == {"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu",
                    "devices": [{"name": "all", "containerEdits": {"deviceNodes": []}}],
                    "containerEdits": {"env": [], "mounts": [{"hostPath": "/usr/bin/nvidia-smi",
                                                             "containerPath": "/usr/bin/nvidia-smi",
                                                             "options": ["ro", "nosuid", "nodev"]}],
                                       "x": 0o644, "y": True, "z": None}}
    yaml = pytest.importorskip("yaml")   # a dev dependency only: where it is, it agrees
    text = text.replace("[{}]", "[]").replace("{major: 1}", "'it''s'")
    assert cdi_spec.parse_yaml(text) == yaml.safe_load(text)


# -- the one-line checks ------------------------------------------------------------------------

def _mount(index: int, **change):
    def edit(spec):
        m = spec["containerEdits"]["mounts"][index]
        for key, value in change.items():
            if value is None:
                m.pop(key)
            else:
                m[key] = value
    return edit


BAD = {
    "unparsable": ("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n  devices: [\n", "not a YAML or JSON CDI spec: line 3"),
    "bad JSON": ('{"cdiVersion": "0.5.0",', "not JSON: "),
    "not a mapping": ("- 1\n- 2\n", "the document is a list, not a mapping"),
    "no cdiVersion": (lambda s: s.pop("cdiVersion"), "no cdiVersion"),
    "other kind": (lambda s: s.update(kind="amd.com/gpu"), "kind 'amd.com/gpu', expected nvidia.com/gpu"),
    "no all device": (lambda s: s.update(devices=[d for d in s["devices"] if d["name"] != "all"]),
                      "no device named 'all'"),
    "no hostPath": (_mount(3, hostPath=None), "containerEdits: mount 4: no hostPath"),
    "no containerPath": (_mount(3, containerPath=None), "containerEdits: mount 4 (/usr/bin/nvidia-"),
    "containerPath outside /": (_mount(3, containerPath="/../etc/shadow"),
                                "containerPath '/../etc/shadow' climbs out with '..' (outside the container's /)"),
    "relative containerPath": (_mount(3, containerPath="usr/bin/x"),
                               "containerPath 'usr/bin/x' is not an absolute path (outside the container's /)"),
    "hostPath under /proc": (_mount(3, hostPath="/proc/driver/nvidia/params"),
                             "hostPath under /proc, which the suite's nodes make themselves"),
    "file under /run": (_mount(3, hostPath="/run/nvidia/driver/usr/bin/nvidia-smi"),
                        "a file under /run, which is a fresh tmpfs on each node"),
    "host directory missing": (_mount(3, hostPath="/no-such-top/bin/nvidia-smi"), "/no-such-top does not exist on this host"),
    "foreign hook": (lambda s: s["containerEdits"]["hooks"][0].update(path="/opt/vendor/hook"),
                     "hook 1 runs /opt/vendor/hook create-symlinks: the suite stands in for nvidia-cdi-hook"),
    "no NVML": (lambda s: s["containerEdits"].update(mounts=[m for m in s["containerEdits"]["mounts"]
                                                             if "libnvidia-ml" not in m["hostPath"]]),
                "no libnvidia-ml.so.<version> mount"),
    "device node outside /dev": (lambda s: s["containerEdits"].update(deviceNodes=[{"path": "/tmp/nvidia0"}]),
                                 "device node 1: path '/tmp/nvidia0' is not under /dev"),
}


def bad_spec(tmp_path, case: str) -> str:
    what, _ = BAD[case]
    if isinstance(what, str):
        return write(tmp_path, "spec.yaml", what)
    spec = json.loads(generated())
    what(spec)
    return write(tmp_path, "spec.json", spec)


@pytest.mark.parametrize("case", BAD)
def test_a_bad_spec_is_one_line_naming_the_file(tmp_path, case):
    """Each problem: BadInput naming the option, the file and what is wrong (the plugin's UsageError,
    the command's exit 2)."""
    path = bad_spec(tmp_path, case)
    with pytest.raises(options.BadInput) as e:
        options.check_cdi_spec(options.flag("cdi-spec", path), options.flag("backend", "kernel"))
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"--cdi-spec {path}: ") and BAD[case][1] in line, line


def test_missing_file_and_directory(tmp_path):
    for path, what in ((str(tmp_path / "nope.yaml"), "no such file"), (str(tmp_path), "a directory, not a spec file")):
        with pytest.raises(options.BadInput, match=f"^--cdi-spec {re.escape(path)}: {what}$"):
            options.check_cdi_spec(options.flag("cdi-spec", path), options.flag("backend", "kernel"))


def test_the_environment_and_the_backends(tmp_path):
    """Named as given (GPUJAIL_CDI_SPEC=...), and only on the kernel backend's own nodes."""
    path = bad_spec(tmp_path, "other kind")
    with pytest.raises(options.BadInput, match=rf"^GPUJAIL_CDI_SPEC={re.escape(path)} \(environment\): kind"):
        options.check_cdi_spec(options.Value("cdi-spec", path, "environment"), options.flag("backend", "kernel"))
    good = write(tmp_path, "good.json", generated())
    for backend, launcher, says in (("model", "", "needs --backend kernel"), ("kernel", "local", "not with --launcher")):
        with pytest.raises(options.BadInput, match=says):
            options.check_cdi_spec(options.flag("cdi-spec", good), options.flag("backend", backend),
                                   options.flag("launcher", launcher))
    assert options.check_cdi_spec(options.flag("cdi-spec", good), options.flag("backend", "kernel")) == good
    assert options.check_cdi_spec(options.flag("cdi-spec", ""), options.flag("backend", "model")) == ""


def test_the_plugin_checks_it_with_every_other_option(tmp_path):
    """The plugin's validator (options.check_all, its pytest.UsageError) checks it too."""
    values = {o.name: options.Value(o.name, o.default, "default") for o in options.OPTIONS}
    values["cdi-spec"] = options.flag("cdi-spec", bad_spec(tmp_path, "no all device"))
    with pytest.raises(options.BadInput, match=r"^--cdi-spec .*spec.json: no device named 'all'"):
        options.check_all(lambda name: values[name])


@pytest.mark.parametrize("command", [["run", "--impl", "cdi"], ["reproduce", "cold-race", "--impl", "cdi"]])
def test_the_command_says_it_in_one_line_with_exit_2_and_starts_nothing(tmp_path, command):
    path = bad_spec(tmp_path, "containerPath outside /")
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUJAIL_") or k == "GPUJAIL_CACHE"}
    r = subprocess.run([sys.executable, "-m", "gpujail", *command, "--cdi-spec", path, "--reports", str(tmp_path / "rep")]
                       if command[0] == "run" else [sys.executable, "-m", "gpujail", *command, "--cdi-spec", path],
                       cwd=tmp_path, env={**env, "TMPDIR": str(tmp)}, capture_output=True, text=True, timeout=120)
    assert r.returncode == EXIT["bad-input"] == 2, r.stdout + r.stderr
    host = json.loads(Path(path).read_text())["containerEdits"]["mounts"][3]["hostPath"]
    assert r.stderr.strip().splitlines() == [f"gpujail: --cdi-spec {path}: containerEdits: mount 4 ({host}): "
                                             "containerPath '/../etc/shadow' climbs out with '..' (outside the "
                                             "container's /)"], r.stderr
    assert not list(tmp.iterdir()) and not (tmp_path / "rep").exists() and not (tmp_path / "reports").exists()


# -- the host the spec describes ----------------------------------------------------------------

def test_a_generated_spec_describes_the_fixture_driver(tmp_path):
    """From the fake's spec of the fixture driver: the catalogue's 64-bit libraries with its sonames
    (from create-symlinks' links, else the catalogue, else the name), binaries, in one tree."""
    vendor = cdi_spec.load(write(tmp_path, "spec.json", generated()))
    assert vendor.version == VERSION
    mine = {(f.path, f.kind, f.soname) for f in vendor.files if f.kind == "library"}
    builtin = {(f.path, f.kind, f.soname) for f in drivers.catalogue(VERSION) if f.kind == "library"}
    assert mine == builtin
    assert {f.path for f in vendor.files if f.kind == "binary"} == \
        {f.path for f in drivers.catalogue(VERSION) if f.kind == "binary"}
    assert all(f.target == f.path for f in vendor.files)


def test_a_hand_edited_spec_of_another_version(tmp_path):
    """Another driver version's names, other file kinds, a containerPath that is not the hostPath,
    device nodes with and without numbers: each becomes a fixture file of its kind at its host path,
    libraries real ELF objects with their soname and the spec's driver version."""
    spec = json.loads(other_version(generated()))
    common = spec["containerEdits"]
    common["mounts"] += [
        {"hostPath": "/usr/share/nvidia/nvoptix.bin", "containerPath": "/usr/share/nvidia/nvoptix.bin"},
        {"hostPath": f"{LIB}/gbm/nvidia-drm_gbm.so", "containerPath": f"{LIB}/gbm/nvidia-drm_gbm.so"},
        {"hostPath": f"/lib/firmware/nvidia/{OTHER}/gsp_ga10x.bin",
         "containerPath": f"/lib/firmware/nvidia/{OTHER}/gsp_ga10x.bin"},
        {"hostPath": "/run/nvidia-fabricmanager/socket", "containerPath": "/run/nvidia-fabricmanager/socket"},
        {"hostPath": "/tmp/nvidia-mps", "containerPath": "/tmp/nvidia-mps"},
        {"hostPath": "/opt/nvidia/libnvidia-extra.so.7", "containerPath": f"{LIB}/libnvidia-extra.so.7"}]
    common["deviceNodes"] = [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia3"}, {"path": "/dev/nvidia-caps/cap1",
                                                                                     "major": 237, "minor": 1}]
    vendor = cdi_spec.load(write(tmp_path, "spec.json", spec))
    assert vendor.version == OTHER
    by_path = {f.path: f for f in vendor.files}
    assert by_path[f"{LIB}/libcuda.so.{OTHER}"].soname == "libcuda.so.1"
    assert by_path[f"{LIB}/libnvidia-glcore.so.{OTHER}"].soname == f"libnvidia-glcore.so.{OTHER}"
    assert by_path["/opt/nvidia/libnvidia-extra.so.7"].target == f"{LIB}/libnvidia-extra.so.7"
    assert {p: by_path[p].kind for p in ("/usr/share/nvidia/nvoptix.bin", f"{LIB}/gbm/nvidia-drm_gbm.so",
                                         f"/lib/firmware/nvidia/{OTHER}/gsp_ga10x.bin", "/run/nvidia-fabricmanager/socket",
                                         "/tmp/nvidia-mps", "/usr/bin/nvidia-smi")} == {
        "/usr/share/nvidia/nvoptix.bin": "file", f"{LIB}/gbm/nvidia-drm_gbm.so": "library",
        f"/lib/firmware/nvidia/{OTHER}/gsp_ga10x.bin": "firmware", "/run/nvidia-fabricmanager/socket": "ipc",
        "/tmp/nvidia-mps": "dir", "/usr/bin/nvidia-smi": "binary"}
    assert set(vendor.devices) == {("/dev/nvidiactl", 195, 255), ("/dev/nvidia3", 195, 3), ("/dev/nvidia-caps/cap1", 237, 1)}
    assert vendor.sockets == ["/run/nvidia-fabricmanager/socket"]
    tree = vendor.materialise()
    assert tree.name.startswith(f"cdi-{OTHER}-")
    for f in vendor.files:
        if not f.on_disk:
            assert not (tree / drivers.tree_path(f)).exists()
            continue
        on_disk = tree / drivers.tree_path(f)
        if f.kind == "dir":
            assert on_disk.is_dir(), f.path
            continue
        data = on_disk.read_bytes()
        assert len(data) > 1024 and on_disk.stat().st_mode & 0o777 == f.mode & 0o777, f.path
        if f.kind == "library":
            assert elf.read_soname(data) == f.soname and OTHER.encode() + b"\0" in data, f.path
        if f.kind == "binary":
            assert data.startswith(b"\x7fELF") or data.startswith(b"#!"), f.path


def test_which_nodes_and_what_the_probes_check(tmp_path, use_settings):
    """The vendor's driver stands in for the default fixture driver on the default layout; the probes
    then ask for its files at their containerPath (configure's selection for the capabilities) and
    its sonames beside them."""
    spec = json.loads(other_version(generated()))
    spec["containerEdits"]["mounts"].append({"hostPath": "/opt/nvidia/libnvidia-ml.so.1.x",
                                             "containerPath": "/usr/lib64/libnvidia-ml.so.1.x"})
    path = write(tmp_path, "spec.json", spec)
    assert probes.gpu_files("/j") == probes.gpu_files("/j", VERSION)   # nothing active: the fixtures
    builtin, newer = probes.gpu_files("/j"), probes.gpu_files("/j", drivers.VERSIONS[1])
    use_settings(cdi_spec=path)
    assert cdi_spec.for_node(VERSION).version == OTHER
    assert cdi_spec.for_node(drivers.VERSIONS[1]) is None and cdi_spec.for_node(VERSION, "rhel") is None
    files = probes.gpu_files("/j")
    fixture = {(f["path"], f["host"], f["load"]) for f in builtin if "/firmware/" not in f["host"]}   # not in this spec
    assert {(f["path"].replace(OTHER, VERSION), f["host"].replace(OTHER, VERSION), f["load"]) for f in files
            if "/opt/" not in f["host"]} == fixture
    assert {"path": "/j/usr/lib64/libnvidia-ml.so.1.x", "host": "/opt/nvidia/libnvidia-ml.so.1.x", "load": True} in files
    sonames = {f["path"] for f in probes.soname_files("/j")}
    assert f"/j{LIB}/libcuda.so.1" in sonames and f"/j{LIB}/libnvidia-ml.so.1" in sonames
    assert probes.gpu_files("/j", drivers.VERSIONS[1]) == newer   # another version: the fixture driver's


# -- the fake prints the vendor's spec ----------------------------------------------------------

def test_the_fake_prints_the_vendors_spec(tmp_path):
    """`nvidia-ctk cdi generate` with GPUJAIL_CDI_SPEC: the vendor's spec in the format asked, each
    hook the fake nvidia-cdi-hook, an old `nvidia-ctk hook` hook translated, a missing ldconfig
    replaced by this host's; flags still checked."""
    spec = json.loads(other_version(generated()))
    hooks = spec["containerEdits"]["hooks"]
    ldcache = next(h for h in hooks if h["args"][1] == "update-ldcache")
    ldcache["args"][2:2] = ["--ldconfig-path", "/sbin/ldconfig.real.nowhere"]
    hooks[0].update(path="/usr/bin/nvidia-ctk", args=["nvidia-ctk", "hook", *hooks[0]["args"][1:]])
    path = write(tmp_path, "vendor.yaml", ctk_render.render(spec, "yaml"))
    env = {**os.environ, cdi_spec.ENV: path, "PATH": f"{BIN}:{os.environ['PATH']}"}   # as on a worker's PATH
    run = [str(BIN / "nvidia-ctk"), "cdi", "generate"]
    out = {fmt: subprocess.run([*run, f"--format={fmt}"], capture_output=True, text=True, env=env) for fmt in ("json", "yaml")}
    assert out["json"].returncode == 0 and out["yaml"].returncode == 0, out["json"].stderr
    printed = json.loads(out["json"].stdout)
    assert cdi_spec.parse_yaml(out["yaml"].stdout) == printed
    hook = str(BIN / "nvidia-cdi-hook")
    assert {h["path"] for h in printed["containerEdits"]["hooks"]} == {hook}
    assert printed["containerEdits"]["hooks"][0]["args"][:2] == ["nvidia-cdi-hook", "create-symlinks"]
    assert "/sbin/ldconfig.real.nowhere" not in json.dumps(printed)
    expected = copy.deepcopy(spec)
    for a, b in zip(expected["containerEdits"]["hooks"], printed["containerEdits"]["hooks"]):
        a.update(path=b["path"], args=b["args"])
    assert printed == expected
    bad = subprocess.run([*run, "--format=toml"], capture_output=True, text=True, env=env)
    assert bad.returncode == 1 and "invalid output format: toml" in bad.stderr


# -- end to end ----------------------------------------------------------------------------------

def node_generated(fleet, fmt: str) -> str:
    """The spec the fake writes on a node, as a vendor runs the real one on their GPU host."""
    r = fleet.start("gen").run([str(BIN / "nvidia-ctk"), "cdi", "generate", f"--format={fmt}"])
    assert r.code == 0, r.stderr
    return r.stdout


@pytest.mark.kernel
@needs_kernel
def test_a_node_serves_the_vendors_driver(fleet, tmp_path, use_settings):
    """A node of the default version gets the spec's files (another version's names) at their host
    paths, its device nodes and sockets; the fake there prints the vendor's spec; a node on another
    version keeps the fixture driver and the fake generates its spec."""
    path = write(tmp_path, "vendor.yaml", other_version(node_generated(fleet, "yaml")))
    use_settings(cdi_spec=path)
    vendor = cdi_spec.active()
    node = fleet.start("v")
    r = node.run(["sh", "-c", f"ls {LIB} | grep -c {OTHER}; ls {LIB} | grep -c {VERSION}; test -S "
                  "/run/nvidia-persistenced/socket && test -c /dev/nvidiactl -o -e /dev/nvidiactl && echo ok"])
    libs = len([f for f in vendor.files if f.kind == "library"])
    assert r.stdout.split() == [str(libs), "0", "ok"], r.stdout + r.stderr
    printed = json.loads(node.run([str(BIN / "nvidia-ctk"), "cdi", "generate", "--format=json"]).stdout)
    assert printed["containerEdits"]["mounts"] == vendor.spec["containerEdits"]["mounts"]
    other = fleet.start("o", version=drivers.VERSIONS[1])
    theirs = json.loads(other.run([str(BIN / "nvidia-ctk"), "cdi", "generate", "--format=json"]).stdout)
    assert any(drivers.VERSIONS[1] in m["hostPath"] for m in theirs["containerEdits"]["mounts"])


def gpujail_run(tmp_path, *args) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUJAIL_") or k == "GPUJAIL_CACHE"}
    return subprocess.run([sys.executable, "-m", "gpujail", "run", "conformance/test_cdi.py", "-n", "2",
                           "--reports", str(tmp_path / "reports"), *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.kernel
@needs_kernel
@pytest.mark.parametrize("edited, impls", [(False, ("cdi",)), (True, ("cdi", "cdi-naive"))], ids=["generated", "hand-edited"])
def test_gpujail_run_with_a_vendor_spec(fleet, tmp_path, edited, impls):
    """`gpujail run --cdi-spec`: `cdi` passes the CDI conformance tests on the vendor's driver (a spec
    the fake generated on a node; the same edited to another driver version) and `cdi-naive` fails
    exactly what its expectations list (5 of 8), as on the fixture driver."""
    text = node_generated(fleet, "yaml")
    path = write(tmp_path, "vendor.yaml", other_version(text) if edited else text)
    for impl in impls:
        r = gpujail_run(tmp_path, "--impl", impl, "--cdi-spec", path)
        assert r.returncode == EXIT["passed"], r.stdout + r.stderr
        summary = json.loads((tmp_path / "reports" / "summary.json").read_text())
        statuses = {t["test"]: t["status"] for req in summary["requirements"].values() for t in req["tests"]}
        wanted = {"passed": 8} if impl == "cdi" else {"expected-fail": 5, "passed": 3}
        assert {s: list(statuses.values()).count(s) for s in set(statuses.values())} == wanted, statuses
