"""TODO: what this room owns and may import."""
