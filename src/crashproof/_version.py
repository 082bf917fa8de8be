"""The package's version, in a module of its own so that any module may read it without
importing the package (which would run ``crashproof/__init__.py`` from below)."""

__version__ = "0.1.0"
