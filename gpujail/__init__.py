"""gpujail: conformance and chaos suite for NVIDIA driver mounts on a shared jail (see SPEC.md)."""
CONTRACT_VERSION = "1.0"
