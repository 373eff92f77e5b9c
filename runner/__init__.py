"""samplerlab runner: the Hydra app around the samplers library."""
