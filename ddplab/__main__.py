"""`python -m ddplab ...`: the `ddplab` command (cli/), for where the console script is not on PATH."""

import sys

from .cli import main

sys.exit(main())
