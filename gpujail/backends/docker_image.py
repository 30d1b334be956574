"""The docker backend's worker image, assembled from this host's own files (no registry).

How this works
--------------
The engine starts with no images and cannot pull, so the worker image is a root file system put
together here and fed to the engine with `docker import`: the system Python (`/usr/bin/python3`)
with its standard library, a shell, coreutils, `flock`, `mount`, `find`, `ldconfig` and the other
tools the bundled implementations and the tests call, each with the shared libraries `ldd` names,
the loader, and a minimal `/etc`. The project itself is *not* in the image: the backend
bind-mounts the repository read-only at its host path, so editing the code needs no rebuild.

The image is tagged `gpujail-worker:<hash>`, the hash taken over every input's image path and
bytes (plus RECIPE), so it is rebuilt only when an input changes (a Python or coreutils upgrade);
on a rebuild the older `gpujail-worker` tags are removed, leaving exactly one cached image.
Parallel test processes build under one `flock`, so only one of them imports.
A missing input or a refused import is one `ImageError` line naming what and where.
"""
from __future__ import annotations

import fcntl
import functools
import glob
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

from gpujail.fixtures.drivers import cache_dir

REPOSITORY = "gpujail-worker"
RECIPE = "2"   # bump when the assembly below changes meaning
PYTHON = "/usr/bin/python3"   # the container's interpreter
TOOLS = ("sh", "bash", "env", "cat", "stat", "mkdir", "rmdir", "rm", "touch", "chmod", "ln", "cp", "mv", "ls",
         "head", "tail", "tr", "cut", "sort", "uniq", "wc", "id", "sleep", "true", "false", "readlink", "realpath",
         "dirname", "basename", "mktemp", "printf", "echo", "test", "[", "tee", "date", "grep", "sed", "awk",
         "xargs", "find", "flock", "mount", "umount", "ldconfig", "kill",
         "unshare", "nsenter")   # the standalone CLI's tests run it from other namespaces (CLI-5)
SEARCH = "/usr/sbin:/usr/bin:/sbin:/bin"
STDLIB_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "site-packages", "dist-packages"}
ETC = {"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n",
       "etc/group": "root:x:0:\nnogroup:x:65534:\n",
       "etc/ld.so.conf": "include /etc/ld.so.conf.d/*.conf\n",
       "etc/ld.so.conf.d/x86_64-linux-gnu.conf": "/usr/local/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n"
                                                 "/usr/lib/x86_64-linux-gnu\n"}
MERGED = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"}   # Debian's merged /usr


class ImageError(RuntimeError):
    """The worker image cannot be built: one line naming what and where."""


def _image_path(host_path: str) -> str:
    """Where a host file goes in the image, through the merged-/usr links (/lib/x -> usr/lib/x)."""
    rel = host_path.lstrip("/")
    top, _, rest = rel.partition("/")
    return f"{MERGED[top]}/{rest}" if top in MERGED and rest else rel


def _shared_libraries(elves: list[str]) -> set[str]:
    """The loader and every shared library `ldd` names for these ELF files (static ones need none)."""
    libs = set()
    for chunk in range(0, len(elves), 200):
        out = subprocess.run(["ldd", *elves[chunk:chunk + 200]], capture_output=True, text=True).stdout
        libs.update(re.findall(r"(?:=> )?(/\S+) \(0x", out))
    return libs


def inputs(tools=TOOLS) -> dict[str, str]:
    """Image path -> host file whose bytes go there. Raises ImageError for a missing input."""
    files: dict[str, str] = {}
    for tool in tools:
        host = shutil.which(tool, path=SEARCH)
        if not host:
            raise ImageError(f"cannot build the worker image: {tool!r} not found on this host (searched {SEARCH})")
        sub = "usr/sbin" if "/sbin/" in host else "usr/bin"
        files[f"{sub}/{tool}"] = os.path.realpath(host)
    real_python = os.path.realpath(PYTHON)
    if not os.path.isfile(real_python):
        raise ImageError(f"cannot build the worker image: {PYTHON} not found on this host")
    files[_image_path(real_python)] = real_python
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    stdlib = os.path.join("/usr/lib", os.path.basename(real_python))
    if not os.path.isdir(stdlib):
        raise ImageError(f"cannot build the worker image: no standard library at {stdlib} for {real_python} "
                         f"(the harness runs {version})")
    for root, dirs, names in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in STDLIB_SKIP and not d.startswith("config-"))
        for n in names:
            p = os.path.join(root, n)
            if os.path.isfile(p):
                files[_image_path(p)] = p
    elves = sorted({h for h in files.values() if not h.startswith(stdlib)} | set(glob.glob(f"{stdlib}/lib-dynload/*.so")))
    for lib in _shared_libraries(elves):
        files[_image_path(lib)] = os.path.realpath(lib)
    return files


def tag_for(files: dict[str, str]) -> str:
    h = hashlib.sha256(f"{RECIPE}\n{PYTHON}\n".encode())
    for dst in sorted(files):
        with open(files[dst], "rb") as f:
            h.update(f"{dst}\0".encode() + hashlib.sha256(f.read()).digest())
    for name in sorted(ETC):
        h.update(f"{name}\0{ETC[name]}".encode())
    return f"{REPOSITORY}:{h.hexdigest()[:16]}"


def _rootfs_tar(files: dict[str, str], path: str) -> None:
    """A deterministic tarball of the root file system (owner root, fixed mtimes)."""
    def add_dir(tar, name, mode=0o755):
        info = tarfile.TarInfo(name)
        info.type, info.mode = tarfile.DIRTYPE, mode
        tar.addfile(info)

    with tarfile.open(path, "w") as tar:
        dirs = {"usr", "usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "etc", "root", "proc", "sys", "dev", "run",
                "tmp", "var", "var/tmp"}
        for dst in files:
            parts = dst.split("/")[:-1]
            dirs.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
        for d in sorted(dirs):
            add_dir(tar, d, 0o1777 if d in ("tmp", "var/tmp") else 0o755)
        for link, target in MERGED.items():
            info = tarfile.TarInfo(link)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        info = tarfile.TarInfo("usr/bin/python3")
        info.type, info.linkname = tarfile.SYMTYPE, os.path.basename(os.path.realpath(PYTHON))
        tar.addfile(info)
        for dst in sorted(files):
            if dst == "usr/bin/python3":
                continue
            st = os.stat(files[dst])
            info = tarfile.TarInfo(dst)
            info.size, info.mode = st.st_size, st.st_mode & 0o7777
            with open(files[dst], "rb") as f:
                tar.addfile(info, f)
        for name, text in sorted(ETC.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(text), 0o644
            tar.addfile(info, io.BytesIO(text.encode()))


@functools.cache
def _recipe(tools: tuple[str, ...]) -> tuple[dict[str, str], str]:
    """The inputs and their tag, once per process (hashing them takes a few tenths of a second)."""
    files = inputs(tools)
    return files, tag_for(files)


def ensure(client, tools=TOOLS) -> str:
    """The worker image's tag, importing it into the engine unless already there."""
    import docker
    files, tag = _recipe(tuple(tools))
    lock_dir = cache_dir()
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / "docker-image.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            client.images.get(tag)
            return tag
        except docker.errors.ImageNotFound:
            pass
        except docker.errors.DockerException as e:
            raise ImageError(f"cannot look up the worker image {tag}: {one_line(e)}") from None
        with tempfile.TemporaryDirectory(prefix="gpujail-image-") as d:
            tar = os.path.join(d, "rootfs.tar")
            try:
                _rootfs_tar(files, tar)
                repo, _, version = tag.partition(":")
                client.api.import_image_from_file(tar, repository=repo, tag=version)
                client.images.get(tag)
            except (OSError, docker.errors.DockerException) as e:
                raise ImageError(f"cannot build the worker image {tag}: {one_line(e)}") from None
        for old in client.images.list(name=REPOSITORY):   # one cached image, not one per upgrade
            if tag not in old.tags:
                try:
                    client.images.remove(old.id, force=True)
                except docker.errors.DockerException:
                    pass
    return tag


def one_line(e: BaseException) -> str:
    """An engine error as one line (the SDK's messages may span several)."""
    text = getattr(e, "explanation", None) or str(e) or type(e).__name__
    return " ".join(str(text).split())[:300]
