"""The package version, in a module of its own so every module can import it without
importing the package's public API (and so without import cycles)."""

__version__ = "0.2.0"
