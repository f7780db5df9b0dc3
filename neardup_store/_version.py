"""The package release, in one place (the store records it)."""

__version__ = "0.1.0"
