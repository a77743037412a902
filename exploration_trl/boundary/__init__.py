"""The TRL/vLLM boundary: the only modules of the package that know TRL's, vLLM's or accelerate's internals.

For the trainers: `trl_adapter` holds the trainer's overrides of TRL's (and transformers') methods and the accessors
through which the rest of the package reads their private state; `vllm_support` the vLLM engine steps (TRL's
`VLLMGeneration` swapped for a CPU-aware one, its server branch, vLLM's engine internals); `capture` reads TRL's
fused-head forward; `fused_head` folds a method's candidate tokens (CaSP's) into that forward's LM-head pass; `loss_terms` and `generation_logps` copy TRL's loss normalisation and log-prob definition;
`prompt_tokens` renders a prompt as TRL does; `trl_warnings` and `deepspeed_import` scope what TRL and accelerate
would do process-wide. For the evaluation harness: `vllm_offline`, its offline `vllm.LLM` engine (start, sample,
stop; the CPU memory share; a failed start in one line). For both: `vllm_engine`, where vLLM runs, whether its CPU
build can run a model, and stopping an engine now.

The rule (`tests/test_architecture.py::test_only_the_boundary_knows_trl_internals`): outside this folder no module
imports a TRL name other than TRL's public top-level ones (`from trl import GRPOTrainer`), nor vLLM, DeepSpeed or
what this folder patches of accelerate; none overrides or calls a private method of TRL's trainer. The boundary
stands below `eval/` and `trainers/` and imports neither, nor `hub/`, `experiments/` or `cli/` (only the package's
lower floors: `rewards`; `tests/test_import_cycles.py`). A TRL or vLLM upgrade is a read of this folder, against
`tests/test_trl_contract.py`.
"""
