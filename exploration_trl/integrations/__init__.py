"""Front ends of the package's methods in other RL frameworks than TRL.

Each module here adapts the framework-free core (`exploration_trl.core`) and the method configs' keys, defaults and
checks (`exploration_trl.trainers`) to one framework, and is imported only by that framework (for verl: its
`verl.plugins` entry point, `exploration_trl.integrations.verl`). Nothing in the package imports this folder; it sits
above every other floor (tests/test_import_cycles.py).
"""
