"""What `nvidia-container-cli configure` mounts per capability (libnvidia-container src/nvc_info.c,
src/nvc_mount.c), as data: the fake CLI, `direct` (which owns this logic instead of the CLI, seed
003) and the probes' oracle all read it from here.
"""
from __future__ import annotations

import os
import re

# Key order is lookup_libraries' order (utility, compute, ngx, video, graphics+glvnd): `list` prints in it.
LIBRARIES = {
    "utility": ["libnvidia-ml", "libnvidia-cfg", "libnvidia-nscq"],
    "compute": ["libcuda", "libcudadebugger", "libnvidia-opencl", "libnvidia-gpucomp", "libnvidia-ptxjitcompiler",
                "libnvidia-fatbinaryloader", "libnvidia-allocator", "libnvidia-compiler", "libnvidia-pkcs11",
                "libnvidia-pkcs11-openssl3", "libnvidia-nvvm"],
    "ngx": ["libnvidia-ngx"],
    "video": ["libvdpau_nvidia", "libnvidia-encode", "libnvidia-opticalflow", "libnvcuvid"],
    "graphics": ["libnvidia-eglcore", "libnvidia-glcore", "libnvidia-tls", "libnvidia-glsi", "libnvidia-fbc",
                 "libnvidia-ifr", "libnvidia-rtcore", "libnvoptix", "libGLX_nvidia", "libEGL_nvidia", "libGLESv2_nvidia",
                 "libGLESv1_CM_nvidia", "libnvidia-glvkspirv", "libnvidia-cbl"],
}
BINARIES = {"utility": ["nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nv-fabricmanager"],
            "compute": ["nvidia-cuda-mps-control", "nvidia-cuda-mps-server"]}
CONTROL_DEVICES = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"]
# (path, capability that mounts it): persistenced/fabricmanager with utility, MPS with compute.
IPCS = [("/run/nvidia-persistenced/socket", "utility"), ("/run/nvidia-fabricmanager/socket", "utility"),
        ("/tmp/nvidia-mps", "compute")]
CAPABILITIES = ("compute", "compat32", "display", "graphics", "utility", "video", "ngx")


def capabilities(spec: str | set[str]) -> set[str]:
    """NVIDIA_DRIVER_CAPABILITIES ("compute,utility", "all") as the set configure acts on:
    video brings the compute libraries, display the graphics ones (options.h)."""
    caps = {c.strip() for c in spec.split(",")} if isinstance(spec, str) else set(spec)
    caps.discard("")
    if "all" in caps:
        caps = (caps - {"all"}) | (set(CAPABILITIES) - {"compat32"})
    if "video" in caps:
        caps.add("compute")
    if "display" in caps:
        caps.add("graphics")
    return caps


def selected(host_path: str, caps: set[str]) -> bool:
    """Whether configure with `caps` (already expanded) mounts this `list` entry."""
    base = os.path.basename(host_path)
    if host_path.startswith("/dev/"):
        if re.fullmatch(r"nvidia\d+", base) or base == "nvidiactl":
            return True
        if "uvm" in base:
            return "compute" in caps
        return "display" in caps   # nvidia-modeset
    if "/firmware/" in host_path:
        return True                # mounted whatever the capabilities (nvc_mount.c)
    for path, cap in IPCS:
        if host_path == path:
            return cap in caps
    if ".so" in base:
        if ("i386" in host_path or host_path.startswith("/usr/lib32/")) and "compat32" not in caps:
            return False
        return any(base.split(".so")[0] in LIBRARIES[c] for c in caps if c in LIBRARIES)
    return any(base in BINARIES[c] for c in caps if c in BINARIES)
