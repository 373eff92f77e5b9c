"""The race (a Hydra sweeper's rounds and advice) and the comparison report: what a sweep or a race publishes, built on ``runner``."""
