"""`python -m exploration_trl.integrations.verl check <Hydra overrides>`: check a verl run's etrl_* settings before
starting it (`_check.py`)."""

import sys

from ._check import main

sys.exit(main())
