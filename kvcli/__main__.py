"""`python -m kvlab.cli ...` runs the `kvlab` command."""

import sys

from kvlab.cli.dispatch import main

sys.exit(main())
