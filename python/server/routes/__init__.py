"""HTTP routes, one module per API family."""
