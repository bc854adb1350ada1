"""policies."""
