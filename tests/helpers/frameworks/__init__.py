"""Real training frameworks driving samplers in two gloo processes (see tests/test_frameworks.py).

``python -m tests.helpers.frameworks.rank SCENARIO ...`` runs in each process; every scenario
prints one ``RESULT <name> <json>`` line with what this rank was given, epoch by epoch.
"""
