"""The bundled demo checkpoint: it loads like a real Nano checkpoint and recalls from latent memory.

The recall test runs the evaluation of ``scripts/eval_tiny.py`` on the held-out split (values and
phrasings training never drew, a seed it never used): a fact is told in an earlier turn that is
committed, and the question's prompt holds only the question, so the answer can only come from memory.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from memt_core.checkpoint import read_checkpoint
from memt_core.families import NANO
from memt_demo import BUNDLED_MODEL
from memt_demo.eval import SPLITS, TARGETS, evaluate
from memt_core.models.weights import load_model, scan_weights


@pytest.fixture(scope="module")
def checkpoint():
    return read_checkpoint(BUNDLED_MODEL)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(BUNDLED_MODEL))


def test_loads_through_the_normal_loader(checkpoint, tokenizer):
    assert checkpoint.model == NANO and checkpoint.model_type == "memt_qwen3_5_moe"
    assert checkpoint.checkpoint_id == "memt-tiny-demo"
    model = load_model(checkpoint)
    assert set(model.memory_layers) == set(checkpoint.memory.memory_layers)
    assert all(kind == "full_attention" for kind in model.config.layer_types)
    assert all(dtype == "BF16" for dtype, _ in scan_weights(checkpoint).values())
    size = sum(p.stat().st_size for p in BUNDLED_MODEL.iterdir() if p.is_file())
    assert size <= 30_000_000  # the limit for a checkpoint shipped inside the package
    assert model.config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_identity_and_template(checkpoint, tokenizer):
    from memt_core.inference import MemTRuntime
    from memt_core import families
    from memt_core.tiny import template_text

    identity = checkpoint.identity()
    assert re.fullmatch(r"[0-9a-f]{64}", identity)
    assert read_checkpoint(BUNDLED_MODEL).identity() == identity
    assert MemTRuntime.load(BUNDLED_MODEL).identity == identity
    assert checkpoint.chat_template() == template_text("nano_chat_template.jinja") == tokenizer.chat_template
    for token in families.get(families.NANO).special_tokens:
        assert tokenizer.convert_tokens_to_ids(token) != tokenizer.unk_token_id
    prompt = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=True, enable_thinking=False, tokenize=False,
    )
    assert prompt.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    recorded = json.loads((BUNDLED_MODEL / "eval.json").read_text())
    # every figure is recorded for both splits, and the targets were checked on the held-out one
    assert set(recorded["splits"]) == set(SPLITS)
    assert set(recorded["splits"]["heldout"]["figures"]) == set(recorded["splits"]["in_distribution"]["figures"])
    assert {name for name, _, _ in TARGETS} <= set(recorded["splits"]["heldout"]["figures"])
    assert len(recorded["targets"]) == len(TARGETS)


@pytest.fixture(scope="module")
def held_out_fact1():
    """200 held-out episodes: one never-seen value each, told and asked with held-out phrasings."""
    report = evaluate(BUNDLED_MODEL, seed=20260, cases={"fact1": 200}, splits=("heldout",))
    result = report["splits"]["heldout"]
    assert result["counts"]["fact1"] == 200
    return result


BOUNDS = {name: bound for name, _, bound in TARGETS}


def test_held_out_values_are_forgotten_after_a_reset(held_out_fact1):
    figures = held_out_fact1["figures"]
    assert figures["fact1_reset"] <= BOUNDS["fact1_reset"], (figures, held_out_fact1["examples"])
    assert figures["fact1_loaded_identical"] == 1.0


#: issue 14's target is 90% held-out 1-fact recall; the bundled checkpoint does not reach it (68% here, 73% in
#: eval.json: the held-out split holds out a fifth of several hundred templates, casual typing included; with
#: training phrasings, held-out values are recalled 91% of the time). This floor guards what it does reach, so a
#: broken model fails.
HELD_OUT_FLOOR = 0.55


def test_held_out_recall_from_memory_stays_above_the_measured_floor(held_out_fact1):
    figures = held_out_fact1["figures"]
    assert figures["fact1"] >= HELD_OUT_FLOOR, (figures, held_out_fact1["examples"])
    assert held_out_fact1["counts"]["fact1_opening_given"] == 200 and figures["fact1_opening_given"] >= figures["fact1"]


def test_the_diagnostic_answer_continues_from_the_given_opening(tokenizer):
    """``answer_after_opening`` decodes after "Your name is" from memory: the value told, not one from the prompt."""
    from memt_demo import episodes as ep
    from memt_demo.eval import Evaluator
    from memt_core.inference import MemTRuntime

    evaluator = Evaluator(MemTRuntime.load(BUNDLED_MODEL), tokenizer)
    fact = ep.Fact("name", "Alice")
    told, untold = evaluator.runtime.open_session(), evaluator.runtime.open_session()
    evaluator.tell(told, ep.EpisodeTurn("Hi, my name is Alice.", ""))
    answer = evaluator.answer_after_opening(told, "Who is talking to you?", fact)
    assert answer == "Your name is Alice.", answer  # the opening, then its continuation (not a whole answer again)
    assert "Alice" not in evaluator.answer_after_opening(untold, "Who is talking to you?", fact)


def test_training_backpropagates_through_the_memory_write(tokenizer):
    """k_proj is used only by writes: its gradient proves the loss reaches the commit through memory."""
    from memt_demo.episodes import EpisodeSampler, Mix
    from memt_demo.format import DemoChatFormat
    from memt_demo.train import TrainConfig, episode_loss, init_model

    torch.manual_seed(0)
    model = init_model(BUNDLED_MODEL, TrainConfig())
    model.train()
    fmt = DemoChatFormat(tokenizer)
    sampler = EpisodeSampler(0)
    batch = [fmt.episode(sampler.facts(Mix(), count=2, turns=2), model.checkpoint.memory.chunk_tokens) for _ in range(3)]
    loss, stats = episode_loss(model, batch)
    loss.backward()
    assert torch.isfinite(loss) and stats.tokens > 0
    for layer in model.memory_layers:
        module = model.memory_module(layer)
        for name in ("k_proj", "v_proj", "b_proj", "a_proj"):
            grad = getattr(module, name).weight.grad
            assert grad is not None and grad.abs().sum() > 0, f"no gradient reaches layer {layer} {name}"
        assert module.A_log.grad is not None and module.A_log.grad.abs().sum() > 0


def test_train_loop_writes_a_loadable_checkpoint(tmp_path):
    from memt_demo.train import TrainConfig, train

    lines = []
    train(TrainConfig(steps=2, batch_size=2, log_every=1), tmp_path, log=lines.append)
    assert any(line.startswith("step 2/2") for line in lines)
    model = load_model(tmp_path)
    assert read_checkpoint(tmp_path).model == NANO and model.memory_layers


def test_learning_rate_decays_by_step_or_by_the_given_progress():
    """Scheduled by time, the fraction of training passed in drives the decay, ending at ``min_lr_ratio``."""
    from memt_demo.train import TrainConfig, lr_at

    config = TrainConfig(steps=1000)
    assert lr_at(400, config) == config.lr and lr_at(999, config) == pytest.approx(config.lr * config.min_lr_ratio, rel=1e-3)
    # after 100 of 1000 steps, a time-scheduled run that has used its whole budget is fully decayed
    assert lr_at(100, config, 1.0) == pytest.approx(config.lr * config.min_lr_ratio)
    assert lr_at(100, config, 0.5) == config.lr and lr_at(100, config, 0.75) < config.lr


def test_training_continues_a_checkpoint_and_records_the_chain(tmp_path):
    """``--init-from`` keeps the tokenizer and starts from the weights; training.json lists the earlier run first."""
    import importlib.util
    from pathlib import Path

    from safetensors.torch import load_file

    spec = importlib.util.spec_from_file_location("train_tiny", Path(__file__).parents[2] / "scripts" / "train_tiny.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    first, second = tmp_path / "first", tmp_path / "second"
    common = ["--steps", "1", "--batch-size", "2", "--threads", "1", "--eval-episodes", "0", "--log-every", "1"]
    assert script.main(["--out", str(first), *common]) == 0
    assert script.main(["--out", str(second), "--init-from", str(first), "--lr", "1e-2", *common]) == 0
    assert (second / "tokenizer.json").read_bytes() == (first / "tokenizer.json").read_bytes()
    record = json.loads((second / "training.json").read_text())
    assert "--init-from" in record["command"] and record["continues"][0]["command"].startswith(
        f"python scripts/train_tiny.py --out {first}")
    assert record["minutes_total"] >= record["continues"][0]["minutes"]
    before, after = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert before.keys() == after.keys() and any(not torch.equal(before[k], after[k]) for k in before)
    load_model(second)


def _script(name: str):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[2] / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_averaging_continued_runs_writes_their_mean_and_records_them(tmp_path):
    """``average_checkpoints.py``: the mean of runs that continue one checkpoint, loadable, with its record;
    runs of different chains are refused."""
    from safetensors.torch import load_file

    train_tiny, averaging = _script("train_tiny"), _script("average_checkpoints")
    first, a, b, soup = (tmp_path / n for n in ("first", "a", "b", "soup"))
    common = ["--steps", "1", "--batch-size", "2", "--threads", "1", "--eval-episodes", "0", "--log-every", "1"]
    assert train_tiny.main(["--out", str(first), *common]) == 0
    for run, seed in ((a, "1"), (b, "2")):
        assert train_tiny.main(["--out", str(run), "--init-from", str(first), "--seed", seed, "--lr", "1e-2", *common]) == 0
        ran = json.loads((run / "training.json").read_text())
        (run / "training.json").write_text(json.dumps({**ran, "minutes": 10.0 * int(seed)}))  # runs of 10 and 20 minutes
    assert averaging.main(["--out", str(soup), str(a), str(b)]) == 0
    weights = [load_file(p / "model.safetensors") for p in (a, b, soup)]
    changed = 0
    for name, tensor in weights[2].items():
        expected = ((weights[0][name].float() + weights[1][name].float()) / 2).to(tensor.dtype)
        assert tensor.dtype == weights[0][name].dtype and torch.equal(tensor, expected), name
        changed += not torch.equal(tensor, weights[0][name])
    assert changed > 0
    record = json.loads((soup / "training.json").read_text())
    assert record["command"].startswith("python scripts/average_checkpoints.py --out") and len(record["averages"]) == 2
    assert record["continues"] == record["averages"][0]["continues"] and record["config"] == record["averages"][0]["config"]
    assert (soup / "tokenizer.json").read_bytes() == (a / "tokenizer.json").read_bytes()
    load_model(soup)
    after = tmp_path / "after"  # a run continuing the average counts the averaged runs' minutes
    assert train_tiny.main(["--out", str(after), "--init-from", str(soup), *common]) == 0
    chained = json.loads((after / "training.json").read_text())
    assert [r["minutes"] for r in chained["continues"][-1]["averages"]] == [10.0, 20.0]
    runs = [json.loads((p / "training.json").read_text())["minutes"] for p in (first, after)]
    assert record["minutes_total"] == pytest.approx(runs[0] + 30.0, abs=0.15)
    assert chained["minutes_total"] == pytest.approx(sum(runs) + 30.0, abs=0.15)
    with pytest.raises(SystemExit, match="same chain"):
        averaging.main(["--out", str(tmp_path / "mixed"), str(first), str(a)])


def test_train_tiny_mix_option_changes_the_full_mix_and_refuses_unknown_fields(capsys):
    """``--mix FIELD=VALUE``: a field of the full mix, of its type, ≥ 0; the curriculum ends on it."""
    from memt_demo.episodes import Mix

    train_tiny = _script("train_tiny")
    assert train_tiny.mix_override("unknown=0.02") == ("unknown", 0.02)
    assert train_tiny.mix_override("max_facts=4") == ("max_facts", 4)
    full = Mix(**dict(map(train_tiny.mix_override, ["unknown=0.02", "max_facts=4"])))
    assert Mix.curriculum(1.0, end=full) == full and Mix.curriculum(0.0, end=full) == Mix.warm_up()
    for bad, message in (("unknwn=1", "FIELD one of facts, unknown"), ("unknown", "not FIELD=VALUE"),
                         ("max_facts=2.5", "max_facts takes an integer"), ("unknown=-1", "must be ≥ 0")):
        with pytest.raises(SystemExit):
            train_tiny.main(["--mix", bad, "--steps", "1"])
        assert message in capsys.readouterr().err, bad


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CI has none; run on a GPU host)")
def test_training_on_cuda_computes_the_cpu_loss_and_saves_a_cpu_checkpoint(tmp_path):
    """``--device cuda``: one batch's loss matches the CPU's (same weights, same episodes), and a run saves a
    checkpoint that loads on the CPU."""
    from transformers import PreTrainedTokenizerFast

    from memt_demo.episodes import EpisodeSampler, Mix
    from memt_demo.format import DemoChatFormat
    from memt_demo.train import episode_loss

    cpu = load_model(read_checkpoint(BUNDLED_MODEL), dtype=torch.float32)
    gpu = load_model(read_checkpoint(BUNDLED_MODEL), device="cuda", dtype=torch.float32)
    fmt, sampler = DemoChatFormat(PreTrainedTokenizerFast.from_pretrained(str(BUNDLED_MODEL))), EpisodeSampler(5)
    batch = [fmt.episode(sampler.sample(Mix()), cpu.checkpoint.memory.chunk_tokens, reply_weight=0.5) for _ in range(8)]
    (on_cpu, cpu_stats), (on_gpu, gpu_stats) = episode_loss(cpu, batch), episode_loss(gpu, batch)
    assert on_gpu.device.type == "cuda" and float(on_gpu) == pytest.approx(float(on_cpu), rel=2e-2)
    assert cpu_stats.tokens == gpu_stats.tokens
    out = tmp_path / "run"
    common = ["--steps", "2", "--batch-size", "4", "--eval-episodes", "0", "--log-every", "1"]
    assert _script("train_tiny").main(["--out", str(out), "--init-from", str(BUNDLED_MODEL), "--device", "cuda", *common]) == 0
    assert json.loads((out / "training.json").read_text())["config"]["device"] == "cuda"
    load_model(read_checkpoint(out))
