"""`python -m trtkv.runtime ENGINE_DIR [--items N]`: the quiz agreement of the engine's KV
format."""

import sys

from trtkv.runtime.quiz import main

sys.exit(main())
