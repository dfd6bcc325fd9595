"""What every API shares between its HTTP routes and the engine: the generation service
(prompts and parameters in, typed deltas out)."""
