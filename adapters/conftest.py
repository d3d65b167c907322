"""Registers the adapter tests' live fixtures (see ``adapter_live.py``)."""

from adapter_live import demo_proxy  # noqa: F401  (pytest fixture)
