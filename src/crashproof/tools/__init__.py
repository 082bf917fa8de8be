"""Tools: the port through which every external side effect goes, and its adapters."""
