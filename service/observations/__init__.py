"""observations."""
