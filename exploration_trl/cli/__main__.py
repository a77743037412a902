"""`python -m exploration_trl.cli ...` (and `accelerate launch -m exploration_trl.cli train ...`)."""

import sys

from .entry_point import main

sys.exit(main())
