"""Named studies, the sampler benchmark and the comparison report."""
