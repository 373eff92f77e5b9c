"""The sampler benchmark, the comparison report (and what it reads and draws), the browser check."""
