"""The package version (one place: the facade, the CLI and saved results read it)."""

__version__ = "0.1.0"
