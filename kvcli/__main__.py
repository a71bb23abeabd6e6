"""`python -m kvlab.cli ...` runs the `kvlab` command."""

import sys

from kvlab.cli.dispatch import main

if __name__ == "__main__":  # (importing the module, as tools that walk packages do, runs nothing)
    sys.exit(main())
