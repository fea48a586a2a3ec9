"""`python -m ddplab.cli ...`: the `ddplab` command."""

import sys

from . import main

sys.exit(main())
