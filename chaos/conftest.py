"""Chaos scenarios run against one implementation (--impl) with seeds from --seed."""
