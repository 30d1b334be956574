"""gpujail: conformance and chaos suite for NVIDIA driver mounts on a shared jail (gpujail/spec.md).

Everything installed lives under this one namespace (docs/architecture.md has the layers). In the
repository, the suites, the implementations and the fixtures keep the top-level folders their users
know (conformance/, chaos/, reference_impl/, fixtures/, benchmarks/, expectations/); each has a
relative symlink here (gpujail/conformance -> ../conformance, ...), so a checkout is the installed
package's tree: `gpujail.conformance` is the same module whether imported from a checkout (worker
starts use `python -S`, which skips an editable install's finder), an editable install or a wheel,
and a tool that walks the tree (import-linter, farm-studio) sees every folder in its layer.
"""
import os

_root = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))   # where `gpujail` is imported from


def __getattr__(name: str):
    """`ROOT`: what a worker's PYTHONPATH names so that `python -S -m gpujail.reference_impl` finds the
    same code, as a Path. Computed on first use: importing pathlib costs every worker process ~10 ms."""
    if name == "ROOT":
        from pathlib import Path
        return Path(_root)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
