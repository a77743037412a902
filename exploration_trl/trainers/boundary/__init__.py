"""The TRL/vLLM boundary: the only modules of the package that know TRL's, vLLM's or accelerate's internals.

`trl_adapter` holds the trainer's overrides of TRL's (and transformers') methods and the accessors through which the
rest of the package reads their private state; `vllm_support` the vLLM engine steps (TRL's `VLLMGeneration` swapped for
a CPU-aware one, its server branch, vLLM's engine internals); `capture` reads TRL's fused-head forward; `loss_terms`
and `generation_logps` copy TRL's loss normalisation and log-prob definition; `prompt_tokens` renders a prompt as TRL
does; `trl_warnings` and `deepspeed_import` scope what TRL and accelerate would do process-wide.

The rule (`tests/test_architecture.py::test_only_the_boundary_knows_trl_internals`): outside this folder no module
imports a TRL name other than TRL's public top-level ones (`from trl import GRPOTrainer`), nor vLLM (but the
evaluation harness's own engine, `eval/`), nor DeepSpeed or what this folder patches of accelerate; none overrides or calls a private method of TRL's trainer. The boundary is the lowest
wing of `trainers`: it imports nothing of the other wings. A TRL upgrade is a read of this folder, against
`tests/test_trl_contract.py`.
"""
