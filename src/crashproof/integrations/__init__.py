"""Adapters for agent frameworks, each behind its own extra and built on ``crashproof``'s
public names only (``import crashproof`` never imports a framework)."""
