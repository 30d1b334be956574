"""Chaos scenarios run against one implementation (--impl) with seeds from --seed.

The gpujail plugin is installed but quiet until asked: this suite asks (see conformance/conftest.py),
for the fixtures `impl`, `fleet_class` and `artefacts_dir`, the `req` marker, expectations, reports.
"""
GPUJAIL_SUITE = True
