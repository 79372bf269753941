"""`python -m trtkv` runs the console script."""

import sys

from trtkv.cli import main

sys.exit(main())
