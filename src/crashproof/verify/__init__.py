"""Proving recovery: crash-point scenarios and the demo."""
