"""The conformance suite: one or more black-box tests per SPEC requirement, run against any
implementation through the contract (CONTRACT.md). `pytest --pyargs conformance --impl NAME|CMD`."""
