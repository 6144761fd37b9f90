"""`python -m cbbench.harness.cli` runs the `cbbench` command line."""

import sys

from cbbench.harness.cli import main

sys.exit(main())
