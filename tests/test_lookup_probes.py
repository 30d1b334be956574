"""The lookup probes (gpujail/backends/node_probes.py `probe_lookup`, requests from probes.lookup_files):
a soname looked up as a GPU job's loader does, through the jail's own `etc/ld.so.cache`. Real
nodes, the real ldconfig, a real dlopen in a child chrooted into the jail.

The premise checked here: the chrooted dlopen reads the *jail's* cache, not a cache (or a loaded
library) inherited from the probing process. A library in a directory the loader never searches by
default (`opt/cacheonly`) is found only through a cache entry, and only the jail's cache has it: with
the entry the lookup loads it, once ldconfig rewrote the cache without it the lookup fails, also
in a round that loaded the very same file by path before (a loaded library answers a dlopen of
its soname with no lookup at all, which the probe must not mistake for one).
"""
from __future__ import annotations

import pytest

from gpujail.backends import kernel
from gpujail.fixtures import elf
from gpujail.fixtures import jail as jail_image

SONAME = "libcacheonly.so.1"
pytestmark = [pytest.mark.kernel,
              pytest.mark.skipif(bool(kernel.precondition()), reason=str(kernel.precondition()))]


def lookups(jail, host) -> list[dict]:
    return [{"lookup": SONAME, "via": via, "root": str(jail), "host": str(host), "ldconfig": jail_image.find_ldconfig()}
            for via in ("ldconfig", "dlopen")]


def test_lookups_read_the_jails_own_cache(tmp_path):
    jail = jail_image.make_jail(tmp_path / "jail")
    lib = jail / "opt/cacheonly" / SONAME
    lib.parent.mkdir(parents=True)
    lib.write_bytes(elf.shared_object(SONAME, tag=b"only the jail's cache names this directory"))
    conf = jail / "etc/ld.so.conf.d/cacheonly.conf"
    conf.write_text("/opt/cacheonly\n")
    assert jail_image.ldconfig(jail).returncode == 0
    with kernel.Fleet.recording(jail, tmp_path / "run") as fleet:
        node = fleet.start("n", role="cpu-worker", version=None)
        cache, dlopen = node.probe(lookups(jail, lib))
        assert cache["resolved"] == "cache: /opt/cacheonly/libcacheonly.so.1" and cache["same_bytes"], cache
        assert dlopen["loader"] == "ok" and dlopen["resolved"] == "/opt/cacheonly/libcacheonly.so.1", dlopen
        assert dlopen["same_bytes"] is True, dlopen

        conf.unlink()   # the same jail, its cache rewritten without the entry
        assert jail_image.ldconfig(jail).returncode == 0
        by_path = {"path": str(lib), "host": str(lib), "load": True}
        loaded, cache, dlopen = node.probe([by_path, *lookups(jail, lib)])
        assert loaded["loader"] == "ok", loaded   # the file is fine and this round loaded it by path
        assert cache["size"] is None and cache["resolved"].startswith("not in the cache"), cache
        assert dlopen["size"] is None and "cannot open shared object file" in dlopen["loader"], dlopen
