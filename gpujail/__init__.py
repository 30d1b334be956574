"""gpujail: conformance and chaos suite for NVIDIA driver mounts on a shared jail (docs/spec.md).

Everything installed lives under this one namespace (docs/architecture.md has the layers). In the
repository, the suites, the implementations and the fixtures keep the top-level folders their users
know (conformance/, chaos/, reference_impl/, fixtures/, benchmarks/, expectations/); pyproject's
package-dir maps them to gpujail.conformance, gpujail.chaos, ... at install time. Run from a source
checkout without that mapping (worker starts use `python -S`, which skips the editable install's
finder), the same names resolve through this package's search path, extended below.
"""
from pathlib import Path

_here = Path(__file__).resolve().parent
# The directory `gpujail` is imported from (a checkout, or site-packages): what a worker's
# PYTHONPATH names so that `python -S -m gpujail.reference_impl` finds the same code.
ROOT = _here.parent
if not (_here / "conformance").is_dir() and (ROOT / "conformance" / "__init__.py").is_file():
    __path__.append(str(ROOT))   # noqa: F821 (a package's own __path__)
