"""What the chaos probes ask a CDI-mode worker for (gpujail/backends/probes.py `spec_files`, SPEC
section 9): the files of the spec the fake `nvidia-ctk cdi generate` writes on that node
(fixtures/cdi_spec.py `generated`), each at its containerPath (CDI-1: the host path, not flattened as
CLI-3), the 64-bit libraries only and no capability selection; a CLI-based worker is still asked
where the CLI mounts (CLI-3).
"""
from __future__ import annotations

import os

import pytest

from gpujail.backends import probes
from gpujail.fixtures import cdi_spec, drivers

VERSION = drivers.DEFAULT_VERSION
CAPS = "compute,utility,compat32"


@pytest.fixture(autouse=True)
def no_vendor_spec(monkeypatch, use_settings):
    monkeypatch.delenv(cdi_spec.ENV, raising=False)
    use_settings(cdi_spec="")


@pytest.mark.parametrize("layout", ["debian", "rhel", "arch"])
def test_a_cdi_mode_worker_is_asked_for_its_spec_at_each_container_path(layout):
    lib64, lib32 = drivers.LAYOUTS[layout]
    cat = drivers.catalogue(VERSION, layout)
    files = probes.gpu_files("/j", VERSION, CAPS, layout, cdi=True)
    libs = {f["path"] for f in files if f["load"]}
    assert libs == {f"/j{f.path}" for f in cat if f.kind == "library"}, \
        "every 64-bit library of the spec (no capability selection), at its host path"
    assert all(f["path"] == "/j" + f["host"] for f in files), "containerPath is the host path (CDI-1)"
    assert not any(f"/j{lib32}/" in p for p in libs) and not any("i386" in f["path"] for f in files), \
        "no 32-bit library: the toolkit looks for none"
    assert {f["path"] for f in files if not f["load"]} == {f"/j{f.path}" for f in cat if f.kind in ("binary", "firmware")}
    sonames = {f["path"] for f in probes.soname_files("/j", VERSION, CAPS, layout, cdi=True)}
    assert f"/j{lib64}/libnvidia-ml.so.1" in sonames and f"/j{lib64}/libGLX_nvidia.so.0" in sonames
    assert all(os.path.dirname(p) == f"/j{lib64}" for p in sonames), "each soname beside its library"


def test_a_cli_based_worker_is_still_asked_where_the_cli_mounts():
    files = {f["path"] for f in probes.gpu_files("/j", VERSION, CAPS, "arch")}
    assert f"/j/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}" in files          # CLI-3, by ELF class
    assert f"/j/usr/lib/i386-linux-gnu/libcuda.so.{VERSION}" in files             # compat32
    assert f"/j/usr/lib/x86_64-linux-gnu/libGLX_nvidia.so.{VERSION}" not in files  # graphics not asked


def test_which_workers_are_cdi_mode(tmp_path, monkeypatch):
    assert probes.cdi_mode("cdi") and probes.cdi_mode("cdi-naive", "reference")
    assert not probes.cdi_mode("legacy", "cdi") and not probes.cdi_mode("reference")
    monkeypatch.setattr(cdi_spec, "active", lambda: object())   # --cdi-spec: the run's own implementation
    assert probes.cdi_mode("bash mine.sh", "bash mine.sh") and not probes.cdi_mode("legacy", "bash mine.sh")
