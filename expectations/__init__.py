"""Expected outcomes of the bundled implementations, as data: `<impl>.toml` lists the tests each is
expected to fail (format in gpujail/conformance/expectations.py). Shipped as package data, so
`gpujail run --impl legacy` finds legacy's own file after a plain `pip install`."""
