"""The research experiments behind the docs' exploratory figures: the tree task (`tree/`, `tree_command`,
`tree_sweep`, with its tabular policy), the Countdown-tiny sweeps and budget curves (`countdown_tiny_command`,
`countdown_sweep`, `curves`) and the method frontier (`frontier`). They found the questions the confirmatory
protocols then tested; none of them gives a verdict.

A room apart from what users run for an answer (`confirm`, the demo): it may import the rest of `experiments/`
(the Countdown-tiny task, the trajectory rule, the helpers), and nothing outside it imports it
(`tests/test_architecture.py`)."""
