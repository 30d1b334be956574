"""Conformance tests run against one implementation (--impl) on one backend (--backend).

The gpujail plugin is installed but quiet until asked: this suite asks, so that it runs as a suite
wherever it is collected from (the repository, or the installed package through `gpujail run` or
`pytest --pyargs gpujail.conformance`, where there is no repository conftest): the fixtures
(`world`, `open_world`, `impl`, `jail`, ...), the `req` marker, expectations, self-checks, reports.
"""
GPUJAIL_SUITE = True
