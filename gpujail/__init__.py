"""gpujail: conformance and chaos suite for NVIDIA driver mounts on a shared jail (gpujail/spec.md).

Everything installed lives under this one namespace (docs/architecture.md has the layers). In the
repository, the suites, the implementations and the fixtures keep the top-level folders their users
know (conformance/, chaos/, reference_impl/, fixtures/, benchmarks/, expectations/); pyproject's
package-dir maps them to gpujail.conformance, gpujail.chaos, ... at install time. Run from a source
checkout without that mapping (worker starts use `python -S`, which skips the editable install's
finder), the same names resolve through this package's search path, extended below.
"""
import os

_here = os.path.dirname(os.path.realpath(__file__))
_root = os.path.dirname(_here)   # the directory `gpujail` is imported from (a checkout, or site-packages)
if not os.path.isdir(os.path.join(_here, "conformance")) and os.path.isfile(os.path.join(_root, "conformance", "__init__.py")):
    __path__.append(_root)   # noqa: F821 (a package's own __path__)


def __getattr__(name: str):
    """`ROOT`: what a worker's PYTHONPATH names so that `python -S -m gpujail.reference_impl` finds the
    same code, as a Path. Computed on first use: importing pathlib costs every worker process ~10 ms."""
    if name == "ROOT":
        from pathlib import Path
        return Path(_root)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
