"""A CPU-only chat appliance: one small GGUF model served to a whole office LAN."""

__version__ = "0.1.0"
