"""Tests for fixtures/elf.py: fake ELF libraries that glibc and ldconfig accept."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpujail.fixtures.elf import executable_script, read_soname, shared_object

VERSION = "550.54.15"

# dlopen in a child process so this test process never keeps the file mapped.
_DLOPEN = """
import ctypes, sys
try:
    ctypes.CDLL(sys.argv[1])
except OSError as e:
    print(e)
    sys.exit(1)
print("loaded")
"""


def dlopen(path):
    """(loaded?, message) for ctypes.CDLL(path) run in a fresh interpreter."""
    r = subprocess.run([sys.executable, "-c", _DLOPEN, str(path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode in (0, 1), f"child crashed ({r.returncode}): {r.stderr}"
    return r.returncode == 0, r.stdout.strip()


def write(path, data, mode=0o644):
    path.write_bytes(data)
    path.chmod(mode)
    return path


def find_ldconfig():
    for cand in (shutil.which("ldconfig"), "/usr/sbin/ldconfig", "/sbin/ldconfig"):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


# 1. glibc loads the x86_64 library ------------------------------------------

def test_x86_64_library_loads_with_ctypes(tmp_path):
    lib = write(tmp_path / f"libnvidia-ml.so.{VERSION}",
                shared_object("libnvidia-ml.so.1", tag=VERSION.encode()))
    assert dlopen(lib) == (True, "loaded")


def test_i386_library_is_rejected_only_for_its_class(tmp_path):
    # A 64-bit process cannot load it; glibc must get as far as the class check.
    lib = write(tmp_path / f"libcuda.so.{VERSION}",
                shared_object("libcuda.so.1", machine="i386"))
    ok, msg = dlopen(lib)
    assert not ok and "wrong ELF class: ELFCLASS32" in msg


# 2. SONAME is visible to readelf and to read_soname ---------------------------

@pytest.mark.parametrize("machine", ["x86_64", "i386"])
def test_read_soname_round_trips(machine):
    for soname in ("libnvidia-ml.so.1", "libcuda.so.1", "libEGL_nvidia.so.0"):
        assert read_soname(shared_object(soname, machine=machine, tag=b"x")) == soname


def test_read_soname_rejects_non_elf_and_reads_real_libc():
    assert read_soname(b"") is None
    assert read_soname(b"#!/bin/sh\necho hi\n" * 10) is None
    assert read_soname(shared_object("libx.so.1")[:100]) is None  # truncated
    libc = Path("/lib/x86_64-linux-gnu/libc.so.6")
    if libc.exists():
        assert read_soname(libc.read_bytes()) == "libc.so.6"


@pytest.mark.skipif(shutil.which("readelf") is None, reason="binutils readelf not installed")
@pytest.mark.parametrize("machine", ["x86_64", "i386"])
def test_readelf_shows_soname(tmp_path, machine):
    lib = write(tmp_path / "libnvidia-ml.so.1.0", shared_object("libnvidia-ml.so.1", machine=machine))
    r = subprocess.run(["readelf", "-W", "-h", "-l", "-d", str(lib)],
                       capture_output=True, text=True, check=True)
    assert "Library soname: [libnvidia-ml.so.1]" in r.stdout
    assert "DYN (Shared object file)" in r.stdout
    assert "NEEDED" not in r.stdout
    assert r.stderr == ""  # no warnings about malformed headers


# 3. ldconfig -n creates the soname symlink -----------------------------------

@pytest.mark.parametrize("machine", ["x86_64", "i386"])
def test_ldconfig_creates_soname_link(tmp_path, machine):
    ldconfig = find_ldconfig()
    if ldconfig is None:
        pytest.skip("ldconfig not found")
    real = f"libcuda.so.{VERSION}"
    write(tmp_path / real, shared_object("libcuda.so.1", machine=machine, tag=VERSION.encode()))
    # -n: only this directory, no cache update (so the system cache is untouched).
    subprocess.run([ldconfig, "-n", str(tmp_path)], check=True, capture_output=True, timeout=60)
    link = tmp_path / "libcuda.so.1"
    assert link.is_symlink(), sorted(p.name for p in tmp_path.iterdir())
    assert os.readlink(link) == real


# 4. the glibc symptom for truncated/placeholder files -------------------------

@pytest.mark.parametrize("content", [b"", b"this is not a library :-)\n"], ids=["empty", "26-byte-text"])
def test_short_files_fail_with_file_too_short(tmp_path, content):
    if content:
        assert len(content) == 26
    lib = write(tmp_path / "libnvidia-ml.so.1", content)
    ok, msg = dlopen(lib)
    assert not ok
    assert "file too short" in msg, msg


# 5. size, tag and determinism --------------------------------------------------

@pytest.mark.parametrize("machine", ["x86_64", "i386"])
def test_sizes_tags_and_determinism(machine):
    a = shared_object("libcuda.so.1", machine=machine, tag=b"550.54.15")
    b = shared_object("libcuda.so.1", machine=machine, tag=b"535.104.05")
    assert len(a) > 1024 and len(a) == 4096  # default size is exact when it fits
    assert a != b and b"550.54.15" in a and b"535.104.05" in b
    assert a == shared_object("libcuda.so.1", machine=machine, tag=b"550.54.15")
    assert len(shared_object("libcuda.so.1", machine=machine, size=1025)) == 1025
    big = shared_object("libcuda.so.1", machine=machine, size=1 << 20)
    assert len(big) == 1 << 20 and read_soname(big) == "libcuda.so.1"
    huge_tag = b"v" * 5000  # content larger than size: file grows, never truncates
    assert len(shared_object("libcuda.so.1", machine=machine, size=1025, tag=huge_tag)) > 5000


def test_padded_and_tagged_library_still_loads(tmp_path):
    lib = write(tmp_path / "libcuda.so.1", shared_object("libcuda.so.1", size=70000, tag=b"\0\xff tag"))
    assert dlopen(lib) == (True, "loaded")


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError):
        shared_object("libx.so.1", machine="aarch64")
    with pytest.raises(ValueError):
        shared_object("libx.so.1", size=1024)


# 6. executable_script ----------------------------------------------------------

@pytest.mark.parametrize("text", [
    "NVIDIA-SMI 550.54.15",
    "line one\nit's got 'quotes', $HOME, `backticks` and \\backslashes\\\n%s %d",
])
def test_executable_script_prints_text(tmp_path, text):
    data = executable_script(text)
    assert data.startswith(b"#!/bin/sh\n") and len(data) >= 2048
    script = write(tmp_path / "nvidia-smi", data, mode=0o755)
    r = subprocess.run([str(script)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout == text + "\n" and r.stderr == ""


def test_executable_script_size_and_determinism():
    assert len(executable_script("x", size=5000)) == 5000
    assert len(executable_script("y" * 3000, size=100)) > 3000
    assert executable_script("x") == executable_script("x")
