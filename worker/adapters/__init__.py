"""One sans-I/O adapter per provider API, and the registry that picks one by name."""
