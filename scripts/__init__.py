"""What make targets run, apart from the product: the benchmarks (``make bench``, ``bench-race``,
``gpu-check``), the docs' tables (``make tables``) and the stored results they read, and the
browser check of the MLflow UI. Nothing in ``samplers``, ``runner`` or ``experiments`` imports it."""
