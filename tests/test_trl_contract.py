"""The TRL 1.16 behaviours the boundary relies on (`exploration_trl/boundary/`: the trainer's TRL adapter,
the vLLM support, the capture of TRL's forward, the copies of TRL's loss normalisation). Each test fails loudly if a
TRL upgrade changes one."""

import inspect

import pytest
import torch
from trl import GRPOTrainer

import exploration_trl as et
from exploration_trl.ops.lm_head import token_statistics
from exploration_trl.boundary.capture import Capture
from helpers import grpo_kwargs, letter_reward, toy_checkpoint, toy_dataset


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return toy_checkpoint(tmp_path_factory.mktemp("toy") / "ckpt")


def make_trainer(ckpt, tmp_path, method="grpo", **overrides):
    cls = et.get_trainer_class(method)
    args = cls.config_class(**grpo_kwargs(tmp_path, **overrides))
    trainer = cls(model=ckpt, reward_funcs=letter_reward, args=args, train_dataset=toy_dataset())
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
    return trainer


def hand_inputs(trainer, seed=0, b=4, p=3, t=5):
    g = torch.Generator().manual_seed(seed)
    vocab = trainer.model.config.vocab_size
    completion_mask = torch.ones(b, t, dtype=torch.long)
    completion_mask[1, 3:] = 0  # a shorter completion
    completion_mask[2, 1:] = 0  # a one-token completion
    return {
        "prompt_ids": torch.randint(10, vocab, (b, p), generator=g),
        "prompt_mask": torch.ones(b, p, dtype=torch.long),
        "completion_ids": torch.randint(10, vocab, (b, t), generator=g),
        "completion_mask": completion_mask,
        "advantages": torch.tensor([1.0, -0.5, 2.0, -1.5]),
        "num_items_in_batch": completion_mask.sum(),
    }


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "luspo"])
def test_aggregation_matches_trl_loss(ckpt, tmp_path, loss_type):
    """On-policy the ratio is 1, so TRL's loss is exactly its aggregation of -A per token."""
    trainer = make_trainer(ckpt, tmp_path, loss_type=loss_type, exploration_metrics=False)
    inputs = hand_inputs(trainer)
    trl_loss = GRPOTrainer.compute_loss(trainer, trainer.model, inputs)
    per_token = -inputs["advantages"][:, None].expand(-1, inputs["completion_mask"].size(1))
    ours = trainer._aggregate_per_token(per_token, inputs["completion_mask"], inputs)
    torch.testing.assert_close(ours, trl_loss.detach(), rtol=1e-6, atol=1e-7)


def test_hidden_state_hook_reproduces_trl_logps(ckpt, tmp_path):
    """The backbone hook sees the hidden states TRL's fused head projects: re-projecting them gives TRL's log-probs."""
    trainer = make_trainer(ckpt, tmp_path, temperature=0.7)
    inputs = hand_inputs(trainer)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    trainer._capture = capture = Capture(mode="rollout")
    with torch.no_grad():
        logps, entropies, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, 5, batch_size=2)
    trainer._capture = None
    assert capture.logps is logps and entropies is None and capture.entropies is not None
    _, head = trainer.lm_head.of(trainer.model)
    hidden = capture.completion_hidden()
    stats = token_statistics(hidden.reshape(-1, hidden.size(-1)), head.weight, head.bias,
                             inputs["completion_ids"].reshape(-1), temperature=0.7)
    valid = inputs["completion_mask"].bool()
    torch.testing.assert_close(stats["target_logps"].view_as(logps)[valid], logps[valid], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(stats["entropy"].view_as(logps)[valid], capture.entropies[valid], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("steps_per_generation,expect_old", [(1, False), (2, True)])
def test_old_logps_condition_mirrors_trl(ckpt, tmp_path, steps_per_generation, expect_old):
    """CaSP predicts when TRL runs its own old-log-prob pass; the prediction must match TRL's output."""
    trainer = make_trainer(ckpt, tmp_path, method="casp", steps_per_generation=steps_per_generation)
    assert trainer._trl_computes_old_logps() is expect_old
    batch = [trainer.train_dataset[i] for i in range(4 * steps_per_generation)]
    out = trainer._generate_and_score_completions(batch)
    assert ("old_per_token_logps" in out) is expect_old
    # Candidates come from the rollout pass exactly when TRL runs one.
    assert ("casp_topn_ids" in out) is expect_old


def test_logged_advantages_are_the_final_ones(ckpt, tmp_path):
    trainer = make_trainer(ckpt, tmp_path, method="dsgrpo", ds_gamma_p=0.3, ds_gamma_n=0.3,
                           ds_logp_granularity="token", log_completions=True)
    batch = [trainer.train_dataset[i] for i in range(4)]
    trainer._generate_and_score_completions([trainer.train_dataset[i] for i in range(4, 8)])
    out = trainer._generate_and_score_completions(batch)
    # TRL logs its own advantages on the step; the final ones replace them at the next log (read then, not on the step).
    trainer.log({})
    logged = torch.tensor(list(trainer._logs["advantages"]))[-4:]
    # DS-GRPO's token granularity gives (B, T) advantages; TRL's log holds one value per completion,
    # so the final advantages are logged as their mean over the completion's tokens.
    mask = out["completion_mask"].float()
    assert out["advantages"].dim() == 2
    torch.testing.assert_close(logged, (out["advantages"].float() * mask).sum(1) / mask.sum(1).clamp(min=1))


def test_trl_loss_forms_ratio_from_returned_logps():
    """`_transform_policy_logps` relies on TRL computing the ratio from the log-probs our override returns."""
    src = inspect.getsource(GRPOTrainer._compute_loss)
    assert "self._get_per_token_logps_and_entropies(" in src
    assert "log_ratio = per_token_logps - old_per_token_logps" in src
    assert 'old_per_token_logps = inputs.get("old_per_token_logps")' in src
    assert "coef_1 = torch.exp(log_importance_weights)" in src


def test_trl_generation_hooks_exist():
    src = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert "self._calculate_rewards(" in src and '"advantages": advantages' in src
    assert 'self._logs["advantages"].extend(all_process_advantages.tolist())' in src
    # ... and reads `_logs` only for the completions table: `_replace_logged_advantages` does nothing without it.
    log_src = inspect.getsource(GRPOTrainer.log)
    assert 'self._logs["advantages"]' in log_src
    assert log_src.index("self.accelerator.is_main_process and self.log_completions:") < log_src.index("self._logs[")
    module_src = inspect.getsource(inspect.getmodule(GRPOTrainer))
    assert module_src.count('self._logs["advantages"]') == 1 + log_src.count('self._logs["advantages"]')  # + extend
    fused = inspect.getsource(inspect.getmodule(GRPOTrainer).add_fused_lm_head)
    assert "backbone_outputs.last_hidden_state[:, :-1]" in fused


def test_trl_rollout_buffer_and_step(ckpt, tmp_path):
    """exploration_trl/trainers/components/resume.py saves and restores `_step` and `_buffered_inputs`: TRL's
    `_prepare_inputs` must read exactly these, generating only when `_step % generate_every == 0` or the buffer is
    empty."""
    trainer = make_trainer(ckpt, tmp_path, steps_per_generation=2, num_iterations=2)
    assert trainer._step == 0 and trainer._buffered_inputs is None
    trainer.model.train()
    slices = [{"slice": 0}, {"slice": 1}]
    trainer._buffered_inputs, trainer._step = slices, 3  # inside the rollout (generate_every 4): served from memory
    assert trainer._prepare_inputs(None) is slices[1]
    trainer._step = 4  # a rollout boundary: TRL generates a new batch, split into steps_per_generation slices
    out = trainer._prepare_inputs([trainer.train_dataset[i] for i in range(8)])
    assert trainer._buffered_inputs is not slices and len(trainer._buffered_inputs) == 2
    assert out is trainer._buffered_inputs[0]
    assert "self._step += 1" in inspect.getsource(GRPOTrainer.training_step)


def test_trainer_checkpoint_hooks_for_resume_state():
    """`_save_rng_state` runs (every process) before `trainer_state.json` marks the checkpoint complete, and the
    training loop calls `_load_rng_state(resume_from_checkpoint)` before the first step of a resumed run."""
    from transformers import Trainer

    save = inspect.getsource(Trainer._save_checkpoint)
    assert "self._save_rng_state(output_dir)" in save
    assert save.index("self._save_rng_state(output_dir)") < save.index("TRAINER_STATE_NAME")
    # resume.py moves an existing checkpoint folder aside by this name while the new one is written
    assert 'checkpoint_folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"' in save
    assert "run_dir = self._get_output_dir(trial=trial)" in save
    loop = inspect.getsource(inspect.getmodule(Trainer))
    assert loop.count("self._load_rng_state(resume_from_checkpoint)") >= 2  # both resume branches of the epoch loop


def test_trl_generation_calls_for_dynamic_sampling_replay(ckpt, tmp_path):
    """`trainers/components/dynamic_sampling.py` replays a selected batch through TRL's
    `_generate_and_score_completions` by overriding `_generate` and `_calculate_rewards`: TRL must call each exactly
    once, `_generate` with the rows' prompts and returning an 8-tuple, and `_calculate_rewards` with `_generate`'s
    completions and completion ids."""
    trainer = make_trainer(ckpt, tmp_path)
    trainer.model.train()
    calls = []
    generate, calculate = trainer._generate, trainer._calculate_rewards

    def spy_generate(prompts):
        out = generate(prompts)
        calls.append(("generate", list(prompts), out))
        return out

    def spy_rewards(inputs, prompts, completions, completion_ids_list):
        calls.append(("rewards", list(prompts), completions, completion_ids_list))
        return calculate(inputs, prompts, completions, completion_ids_list)

    trainer._generate, trainer._calculate_rewards = spy_generate, spy_rewards
    rows = [trainer.train_dataset[i // 4] for i in range(8)]  # 2 prompts x num_generations 4
    trainer._generate_and_score_completions(rows)
    assert [c[0] for c in calls] == ["generate", "rewards"]
    (_, prompts, out), (_, reward_prompts, completions, completion_ids) = calls
    assert prompts == reward_prompts == [r["prompt"] for r in rows]
    assert len(out) == 8 and completions is out[3] and completion_ids is out[1]


def test_trl_train_sampler_layout_for_dynamic_sampling_refills(ckpt, tmp_path):
    """Dynamic sampling draws refill prompts from a second dataloader with TRL's `RepeatSampler` layout: TRL's
    train sampler must be a RepeatSampler of `generation_batch_size / num_generations` prompts, each repeated
    `num_generations` times in a row, and its dataloader must yield `per_device_train_batch_size x
    steps_per_generation` rows per process."""
    from trl.trainer.utils import RepeatSampler

    trainer = make_trainer(ckpt, tmp_path, steps_per_generation=2, dynamic_sampling=True)
    sampler = trainer._get_train_sampler()
    assert isinstance(sampler, RepeatSampler)
    assert (sampler.mini_repeat_count, sampler.batch_size) == (4, trainer.args.generation_batch_size // 4)
    assert sampler.repeat_count == trainer.args.steps_per_generation * trainer.num_iterations
    refill = trainer.dynamic_sampling.refill_sampler(trainer.train_dataset)
    assert (refill.mini_repeat_count, refill.batch_size, refill.repeat_count) == (4, sampler.batch_size, 1)
    assert refill.seed == sampler.seed + 1
    assert len(next(iter(trainer.get_train_dataloader()))) == 8 == len(trainer.dynamic_sampling.refill_batch())
    batch = trainer.dynamic_sampling.refill_batch()
    assert all(batch[i]["prompt"] == batch[i - i % 4]["prompt"] for i in range(8))  # groups of 4 contiguous rows


def test_hf_evaluation_schedule_for_heldout_eval(ckpt, tmp_path):
    """`trainers/components/heldout_eval.py` relies on: TRL's GRPOTrainer not overriding `evaluate` (only
    `prediction_step`); `Trainer._evaluate` calling `self.evaluate(...)` and reading `metric_for_best_model` from its
    result; `Trainer.__init__` refusing `eval_strategy` without an `eval_dataset` (lifted for the duration of
    `__init__`); TRL's `log` prefixing its metrics with `eval_` when the model is in eval mode."""
    from transformers import Trainer

    assert GRPOTrainer.evaluate is Trainer.evaluate
    assert "prediction_step" in GRPOTrainer.__dict__
    assert "self.evaluate(" in inspect.getsource(Trainer._evaluate)
    assert "metric_for_best_model" in inspect.getsource(Trainer._determine_best_metric)
    log_src = inspect.getsource(GRPOTrainer.log)
    assert 'mode = "train" if self.model.training else "eval"' in log_src and 'f"eval_{key}"' in log_src
    with pytest.raises(ValueError, match="didn't pass an `eval_dataset`"):
        GRPOTrainer(model=ckpt, reward_funcs=letter_reward, train_dataset=toy_dataset(),
                    args=et.ExplorationGRPOConfig(**grpo_kwargs(tmp_path, eval_strategy="steps", eval_steps=1)))


def test_trl_log_appends_to_log_history_for_the_divergence_check(ckpt, tmp_path):
    """`trainers/callbacks/divergence.py` reads `state.log_history` after `super().log(...)`."""
    trainer = make_trainer(ckpt, tmp_path)
    trainer.model.train()
    trainer.log({"reward": 0.5, "entropy": 1.0})
    assert trainer.state.log_history[-1]["reward"] == 0.5 and trainer.state.log_history[-1]["entropy"] == 1.0


def test_trl_entropy_bonus_reads_the_coefficient_the_entropy_band_sets():
    """trainers/callbacks/entropy_band.py with `entropy_band_knob: entropy_coef` sets `GRPOTrainer.entropy_coef` after
    each optimizer step and switches `_entropy_bonus_enabled` on: TRL 1.16 decides the switch once at init and reads the
    coefficient on every micro-batch of `_compute_loss`; `cov_selection: global` reads the step's micro-batches from
    `_buffered_inputs` (pinned by `test_trl_rollout_buffer_and_step`)."""
    src = inspect.getsource(GRPOTrainer._compute_loss)
    assert "if self._entropy_bonus_enabled:" in src and "apply_coef = self.entropy_coef" in src
    assert "self._entropy_bonus_enabled = " in inspect.getsource(GRPOTrainer.__init__)


def test_trl_vllm_behaviours_the_cpu_support_relies_on():
    """`boundary/vllm_support.py` (vLLM on a CPU) relies on TRL 1.16:
    - `GRPOTrainer.__init__` building its engine as `VLLMGeneration(...)`, the name imported into
      `trl.trainer.grpo_trainer` (the CPU subclass is put in its place while `__init__` runs);
    - the colocate sync handing vLLM's model one parameter at a time to `model.load_weights` (what vLLM's CPU backend,
      having dropped the packed linear weights, cannot take), and the server branch calling `init_communicator`,
      which refuses any device but CUDA;
    - `_iter_named_params` merging a PEFT adapter before yielding and unmerging it after the last name;
    - colocate generation passing `generation_kwargs` into `SamplingParams` (how `prompt_logprobs` is asked for) and
      calling `self.llm.generate(...)` once (the instance-level wrapper that keeps the prompt log-probs), with vLLM
      started in `processed_logprobs` mode;
    - `sampling_per_token_logps` in the rollout output whenever vLLM returned log-probs, the correction on or off."""
    import trl.trainer.grpo_trainer as grpo_module
    from trl.generation.vllm_client import VLLMClient
    from trl.generation.vllm_generation import VLLMGeneration

    assert grpo_module.VLLMGeneration is VLLMGeneration
    assert "self.vllm_generation = VLLMGeneration(" in inspect.getsource(GRPOTrainer.__init__)
    sync = inspect.getsource(VLLMGeneration.sync_weights)
    assert "model_runner.model.load_weights([(name, param)])" in sync
    assert "for name, param in self._iter_named_params():" in sync
    init = inspect.getsource(VLLMGeneration._init_vllm)
    assert "self.vllm_client.init_communicator(device=accelerator.device)" in init
    assert 'logprobs_mode="processed_logprobs"' in init and 'distributed_executor_backend="external_launcher"' in init
    communicator = inspect.getsource(VLLMClient.init_communicator)
    assert "NotImplementedError" in communicator and "cuda" in communicator
    params = inspect.getsource(VLLMGeneration._iter_named_params)
    assert params.index("model.merge_adapter()") < params.index("yield") < params.index("model.unmerge_adapter()")
    generate = inspect.getsource(VLLMGeneration.generate)
    assert "generation_kwargs.update(self.generation_kwargs)" in generate
    assert generate.count("self.llm.generate(") == 1
    rollout = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert "if sampling_per_token_logps is not None:" in rollout
    assert 'output["sampling_per_token_logps"] = sampling_per_token_logps' in rollout


def test_every_private_name_the_adapter_uses_exists_in_this_trl(ckpt, tmp_path):
    """The TRL adapter (`boundary/trl_adapter.py`) and the vLLM support (its CPU engine) are the modules that
    touch TRL's and transformers' private names (issues 45 and 54): each one they read, call or override exists in the
    installed TRL, on a built trainer or on TRL's vLLM engine, and the accessors return what the components expect of
    them."""
    import ast
    import collections
    from pathlib import Path

    from trl.generation.vllm_generation import VLLMGeneration

    import exploration_trl.trainers.base as base
    from exploration_trl.boundary import trl_adapter, vllm_support

    ours = {name for cls in (base.ExplorationGRPOTrainer,) for name in vars(cls)}
    own_state = {"_capture", "_ds_replay", "_loss_inputs", "_loss_state", "_ran_hooks", "_given_once", "_divergence",
                 "_assembled", "_server_weights_dir", "Capture"}
    used = {node.attr for module in (trl_adapter, vllm_support)
            for node in ast.walk(ast.parse(Path(module.__file__).read_text()))
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")}
    theirs = used - own_state - {n for n in ours if n not in vars(GRPOTrainer) and not hasattr(GRPOTrainer, n)}
    trainer = make_trainer(ckpt, tmp_path)
    missing = [n for n in sorted(theirs) if not (hasattr(trainer, n) or hasattr(VLLMGeneration, n)
                                                 or n in inspect.getsource(VLLMGeneration))]
    assert missing == []
    # The shapes the accessors hand on.
    assert isinstance(trainer.metrics_window("train"), collections.defaultdict)
    assert trainer.rollout_buffer() == (0, None)
    assert isinstance(trainer.extra_log_columns(), collections.defaultdict) and trainer.is_vision_language() is False
    batch = next(iter(trainer.training_dataloader(trainer.dynamic_sampling.refill_sampler)))
    assert len(batch) == trainer.args.generation_batch_size  # one generation batch per draw, as TRL's loader


# ------------------------------------------------------------- a trainer whose `__init__` did not finish
def _half_built(cls, rollout_func):
    """A trainer built the way TRL's own tests build one: `object.__new__` plus the attributes TRL's `_generate` reads
    before it calls a custom `rollout_func` (so none of the package's state exists)."""
    from types import SimpleNamespace

    trainer = object.__new__(cls)
    trainer.accelerator = SimpleNamespace(device=torch.device("cpu"))
    trainer.model = torch.nn.Linear(1, 1)
    trainer.rollout_func, trainer.use_vllm = rollout_func, False
    return trainer


def test_a_half_built_grpo_trainer_raises_trls_own_error_for_a_short_rollout_func():
    """0.8.0 raised AttributeError('_ds_replay') here: an override read state only `__init__` sets."""
    def short(prompts, trainer):
        return {"prompt_ids": [[1]]}

    with pytest.raises(ValueError) as trl_error:
        GRPOTrainer._generate(_half_built(GRPOTrainer, short), ["a prompt"])
    assert "rollout_func must return keys ['completion_ids', 'logprobs']" in str(trl_error.value)
    for method in ("grpo", "dsgrpo", "progrpo+casp"):
        with pytest.raises(ValueError) as ours:
            _half_built(et.get_trainer_class(method), short)._generate(["a prompt"])
        assert str(ours.value) == str(trl_error.value), method


def test_every_override_of_trl_defers_to_trl_until_init_finishes():
    """No override may read state only `__init__` sets: each one carries `trl_until_assembled`, which runs TRL's
    method until the trainer is assembled. A new override without it fails here."""
    from exploration_trl.trainers.base import ExplorationGRPOTrainer
    from exploration_trl.boundary.trl_adapter import TRLAdapter

    overrides = {
        f"{cls.__name__}.{name}": value for cls in (TRLAdapter, ExplorationGRPOTrainer)
        for name, value in vars(cls).items()
        if inspect.isfunction(value) and not name.startswith("__") and hasattr(GRPOTrainer, name)
    }
    assert {f"TRLAdapter.{n}" for n in ("_generate", "_calculate_rewards", "compute_loss",
                                        "_generate_and_score_completions")} <= set(overrides)
    unguarded = sorted(n for n, value in overrides.items() if not getattr(value, "trl_until_assembled", False))
    assert unguarded == []
    assert ExplorationGRPOTrainer._assembled is False  # the class default a half-built trainer reads


def test_an_assembled_trainer_runs_its_overrides(ckpt, tmp_path):
    trainer = make_trainer(ckpt, tmp_path)
    assert trainer._assembled is True and "_assembled" in vars(trainer)
