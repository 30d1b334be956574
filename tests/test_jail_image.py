"""The jail image every worker shares: a Debian-style skeleton with the small files a careless placeholder
predicate would eat, and deliberately no firmware or 32-bit library directory (SPEC CLI-3, REF-9).
"""
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpujail.fixtures import drivers, elf
from gpujail.fixtures.jail import LIB64, NCURSES_SCRIPT, REAL_LIB, STUB_ARCHIVES, ldconfig, make_jail, snapshot


def is_placeholder(path):
    """REF-9's predicate: a regular file (not a symlink) named lib*.so.* below 64 bytes."""
    st = os.lstat(path)
    return stat.S_ISREG(st.st_mode) and re.fullmatch(r"lib.*\.so\..*", os.path.basename(path)) and st.st_size < 64


def test_debian_skeleton_with_merged_usr(jail):
    """CLI-3: `etc/debian_version` makes the CLI use Debian library directories; merged-usr symlinks
    (`lib -> usr/lib`) are relative, so they resolve inside the jail (REF-2)."""
    assert (jail / "etc/debian_version").read_text() == "12.11\n"
    for link, target in (("lib", "usr/lib"), ("lib64", "usr/lib64"), ("bin", "usr/bin"), ("sbin", "usr/sbin")):
        assert os.readlink(jail / link) == target
    for d in ("dev", "run", "proc", "tmp", "usr/bin", LIB64):
        assert (jail / d).is_dir() and not (jail / d).is_symlink(), d
    assert list((jail / "dev").iterdir()) == [] and list((jail / "run").iterdir()) == []
    assert stat.S_IMODE(os.stat(jail / "tmp").st_mode) == 0o1777
    assert "/usr/lib/x86_64-linux-gnu" in (jail / "etc/ld.so.conf.d/x86_64-linux-gnu.conf").read_text().split()


def test_cold_jail_has_no_firmware_or_32bit_directory(jail):
    """CLI-4: at cold bring-up the CLI must create these directories itself: the mkdir race of seed 000."""
    assert not os.path.lexists(jail / "usr/lib/firmware")
    assert not os.path.lexists(jail / "lib/firmware")
    assert not os.path.lexists(jail / "usr/lib/i386-linux-gnu")


def test_small_files_that_are_not_placeholders(jail):
    """REF-9: the 31-byte ncurses linker script and the 8-byte `!<arch>` stub archives are real image
    files; none of them (nor anything else in a fresh image) matches the placeholder predicate."""
    lib = jail / LIB64
    assert (lib / "libncurses.so").read_bytes() == b"INPUT(libncurses.so.6 -ltinfo)\n" == NCURSES_SCRIPT
    assert os.path.getsize(lib / "libncurses.so") == 31
    assert len(STUB_ARCHIVES) >= 5 and "libpthread.a" in STUB_ARCHIVES
    for name in STUB_ARCHIVES:
        assert (lib / name).read_bytes() == b"!<arch>\n"
    every = [os.path.join(d, n) for d, _, names in os.walk(jail) for n in names]
    assert [p for p in every if is_placeholder(p)] == []


_LOAD = "import ctypes, sys; ctypes.CDLL(sys.argv[1]); print('ok')"


def test_real_library_with_soname_and_dev_links(jail):
    """REF-9/K-3: a real shared object above 1 KiB, its soname link and its dev link, which loads."""
    real, soname = REAL_LIB
    lib = jail / LIB64
    data = (lib / real).read_bytes()
    assert len(data) > 1024 and elf.read_soname(data) == soname
    assert os.readlink(lib / soname) == real
    assert os.readlink(lib / "libgpujail-example.so") == soname
    r = subprocess.run([sys.executable, "-c", _LOAD, str(lib / soname)], capture_output=True, text=True, timeout=60)
    assert r.stdout == "ok\n", r.stderr


def test_snapshot_sees_type_mode_size_and_link_changes(tmp_path):
    """INV-3: the snapshot a bad-input test compares before/after notices any created, resized,
    re-moded or re-pointed path."""
    jail = make_jail(tmp_path / "jail")
    before = snapshot(jail)
    assert before == snapshot(jail)
    assert before["lib"][0] == stat.S_IFLNK | 0o777 and before["lib"][2] == "usr/lib"
    assert before[f"{LIB64}/libncurses.so"][1:] == (31, None)
    changes = [
        lambda: (jail / LIB64 / "libnvidia-ml.so.550.54.15").touch(),
        lambda: (jail / "etc/debian_version").write_text("13\n"),
        lambda: (jail / "etc/os-release").chmod(0o600),
        lambda: (os.unlink(jail / "bin"), os.symlink("usr/sbin", jail / "bin")),
        lambda: (jail / "usr/lib/firmware").mkdir(),
    ]
    for change in changes:
        change()
        after = snapshot(jail)
        assert after != before
        before = after


def test_make_jail_refuses_an_existing_image(tmp_path):
    """INV-3: a second make_jail on the same path fails rather than silently mixing two images (the
    before/after comparison needs one known image)."""
    make_jail(tmp_path / "jail")
    with pytest.raises(FileExistsError):
        make_jail(tmp_path / "jail")


def test_ldconfig_refreshes_the_jails_own_cache(jail):
    """REF-8/K-3: `ldconfig -r JAIL` (the host's real ldconfig, chrooted into the jail) writes
    JAIL/etc/ld.so.cache and the soname link of a real driver library dropped into the jail."""
    if os.getuid() != 0:
        pytest.skip("ldconfig -r chroots into the jail, which needs root (CAP_SYS_CHROOT)")
    version = drivers.DEFAULT_VERSION
    ml = next(f for f in drivers.catalogue(version) if f.path.endswith(f"/libnvidia-ml.so.{version}"))
    shutil.copy(drivers.materialise(version) / drivers.tree_path(ml), jail / LIB64)
    host_cache = Path("/etc/ld.so.cache").read_bytes() if os.path.exists("/etc/ld.so.cache") else None
    r = ldconfig(jail)
    assert r.returncode == 0, r.stderr
    cache = (jail / "etc/ld.so.cache").read_bytes()
    assert b"libnvidia-ml.so.1" in cache and b"libgpujail-example.so.1" in cache
    assert os.readlink(jail / LIB64 / "libnvidia-ml.so.1") == f"libnvidia-ml.so.{version}"
    assert (Path("/etc/ld.so.cache").read_bytes() if os.path.exists("/etc/ld.so.cache") else None) == host_cache
