"""The artifact cache: keys, the store interface and its backends, locks, machine-local state."""
