"""Storage: the port (a small Protocol) and its implementations."""
