"""``python -m experiments.report``: the report's command line (:mod:`experiments.report.cli`)."""

import sys

from experiments.report.cli import main

sys.exit(main())
