"""Request parameters and their one rule book."""
