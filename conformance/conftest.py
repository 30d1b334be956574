"""Conformance tests run against one implementation (--impl) on one backend (--backend)."""
