"""The package version (one place; the facade and `mmfl --version` read it)."""

__version__ = "0.1.0"
