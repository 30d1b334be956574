"""Bundled implementations: `reference` (the fixed procedure), `legacy` (the bug, on demand),
`direct` (mount without the CLI, seed 003) and `example.sh` (the shell template for vendors)."""
