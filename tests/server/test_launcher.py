"""``python -m memt_core.launch``: ``--dry-run`` output, the ``memt_runtime`` merge order, startup
refusals, and the ``scripts/start_memt_{nano,flash}.sh`` wrappers.

The launches that matter as processes (dry-runs, the environment refusal, the scripts) run as real
subprocesses, concurrently in one fixture (each is mostly interpreter start-up on a slow machine);
the matrix of merge and refusal cases calls the same ``main(argv)`` in-process.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"


@dataclass
class Case:
    argv: list[str]  # after "python -m memt_core.launch", or a script invocation when script is set
    env: dict[str, str] = field(default_factory=dict)
    script: str | None = None
    unset: tuple[str, ...] = ()


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> dict:
        assert self.returncode == 0, self.stderr
        return json.loads(self.stdout)


@pytest.fixture(scope="module")
def checkpoints(nano_checkpoint, flash_checkpoint, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("launcher")
    no_runtime = root / "nano-no-runtime"
    shutil.copytree(nano_checkpoint, no_runtime)
    config = json.loads((no_runtime / "config.json").read_text())
    del config["memt_runtime"]
    (no_runtime / "config.json").write_text(json.dumps(config))
    no_weights = root / "nano-no-weights"
    shutil.copytree(nano_checkpoint, no_weights)
    for weights in no_weights.glob("*.safetensors"):
        weights.write_bytes(b"not safetensors: --dry-run must never read the weights")
    from memt_core.models.weights import save_weights
    from memt_core.tiny import random_model, write_config

    flash8 = root / "flash-8-experts"  # Flash shaped for the seed's 8/8/8: 8 experts, one per EP rank
    write_config(flash8, "memt-flash")
    config = json.loads((flash8 / "config.json").read_text())
    config["n_routed_experts"] = 8
    (flash8 / "config.json").write_text(json.dumps(config))
    save_weights(random_model(flash8), flash8)
    wrapper = root / "python-wrapper.sh"  # MEMT_PYTHON for the script tests: reports its environment
    wrapper.write_text(f'#!/bin/sh\necho "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES" >&2\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    return {"nano": nano_checkpoint, "flash": flash_checkpoint, "flash8": flash8, "no_runtime": no_runtime, "no_weights": no_weights,
            "wrapper": wrapper, "cwd": root}


def _cases(c: dict[str, Path]) -> dict[str, Case]:
    nano, flash, flash8 = str(c["nano"]), str(c["flash"]), str(c["flash8"])
    dry = ["--dry-run"]
    override = json.dumps({"memt_runtime": {"max_sessions_per_rank": 10, "min_kv_tokens": 512}})
    script_env = {"MEMT_PYTHON": str(c["wrapper"])}
    return {
        "nano": Case(["--model-path", nano, *dry]),
        "flash": Case(["--model-path", flash, *dry]),
        "no weights": Case(["--model-path", str(c["no_weights"]), *dry]),
        "merge all": Case(["--model-path", nano, *dry, "--json-model-override-args", override, "--max-sessions-per-rank", "3"]),
        "merge json": Case(["--model-path", nano, *dry, "--json-model-override-args", override]),
        "defaults": Case(["--model-path", str(c["no_runtime"]), *dry]),
        "defaults + flags": Case(["--model-path", str(c["no_runtime"]), *dry, "--max-inflight-commits-per-rank", "5", "--min-kv-tokens", "7"]),
        "compiled": Case(["--model-path", nano, *dry, "--enable-torch-compile"]),
        "one thread": Case(["--model-path", nano, *dry, "--torch-threads", "1"]),
        "threads by default": Case(["--model-path", nano, *dry], unset=("OMP_NUM_THREADS",)),
        "threads from OMP": Case(["--model-path", nano, *dry], env={"OMP_NUM_THREADS": "1"}),
        "header overrides off": Case(["--model-path", nano, *dry], env={"SGLANG_ENABLE_REQUEST_HEADER_OVERRIDES": "0"}),
        # refusals
        "trust remote code": Case(["--model-path", nano, *dry, "--trust-remote-code"]),
        "config merging": Case(["--model-path", nano, *dry, "--config", "server.yaml"]),
        "header overrides 1": Case(["--model-path", nano, *dry], env={"SGLANG_ENABLE_REQUEST_HEADER_OVERRIDES": "1"}),
        "header overrides true": Case(["--model-path", nano, *dry], env={"SGLANG_ENABLE_REQUEST_HEADER_OVERRIDES": "true"}),
        "override other keys": Case(["--model-path", nano, *dry, "--json-model-override-args",
                                     json.dumps({"memt_runtime": {"max_sessions_per_rank": 2}, "num_hidden_layers": 2})]),
        "override memt": Case(["--model-path", nano, *dry, "--json-model-override-args", json.dumps({"memt": {"chunk_tokens": 64}})]),
        "override not JSON": Case(["--model-path", nano, *dry, "--json-model-override-args", "{memt_runtime: 1"]),
        "override unknown runtime field": Case(["--model-path", nano, *dry, "--json-model-override-args",
                                                json.dumps({"memt_runtime": {"max_batch": 4}})]),
        "override non-positive": Case(["--model-path", nano, *dry, "--json-model-override-args",
                                       json.dumps({"memt_runtime": {"min_kv_tokens": 0}})]),
        "flag non-positive": Case(["--model-path", nano, *dry, "--max-sessions-per-rank", "0"]),
        "no threads": Case(["--model-path", nano, *dry, "--torch-threads", "0"]),
        "prefill below chunk": Case(["--model-path", nano, *dry, "--max-prefill-tokens", "31"]),
        "context beyond model": Case(["--model-path", nano, *dry, "--context-length", "9000"]),
        "missing checkpoint": Case(["--model-path", str(c["cwd"] / "nowhere"), *dry]),
        "bundled default": Case([*dry]),
        "engine unknown": Case(["--model-path", nano, *dry, "--engine", "sglang"]),
        "engine flag unused": Case(["--model-path", nano, *dry, "--deterministic-communication"]),
        "nano tp 2": Case(["--model-path", nano, *dry, "--tp-size", "2", "--deterministic-communication"]),
        "nano dp attention": Case(["--model-path", str(c["no_weights"]), *dry, "--tp-size", "2", "--dp-size", "2", "--enable-dp-attention"]),
        "flash tp without dp attention": Case(["--model-path", flash8, *dry, "--tp-size", "2"]),
        "flash dp below tp": Case(["--model-path", flash8, *dry, "--tp-size", "8", "--ep-size", "8", "--dp-size", "4", "--enable-dp-attention"]),
        "ep beyond experts": Case(["--model-path", flash, *dry, "--tp-size", "8", "--ep-size", "8", "--dp-size", "8", "--enable-dp-attention"]),
        "tp beyond heads": Case(["--model-path", nano, *dry, "--tp-size", "8"]),
        "nccl on cpu": Case(["--model-path", nano, *dry, "--device", "cpu", "--tp-size", "2", "--dist-backend", "nccl"]),
        "dp without dp attention": Case(["--model-path", nano, *dry, "--dp-size", "2"]),
        "backend not here": Case(["--model-path", nano, *dry, "--attention-backend", "flashinfer"]),
        "chunked prefill on": Case(["--model-path", nano, *dry, "--chunked-prefill-size", "8192"]),
        "total below min kv": Case(["--model-path", nano, *dry, "--max-total-tokens", "1", "--min-kv-tokens", "2"]),
        "fraction beyond one": Case(["--model-path", nano, *dry, "--mem-fraction-static", "1.5"]),
        "graphs both ways": Case(["--model-path", nano, *dry, "--device", "cpu", "--disable-cuda-graph", "--enable-cuda-graph"]),
        "bf16 kv on float32": Case(["--model-path", nano, *dry, "--device", "cpu", "--kv-cache-dtype", "bf16"]),
        "paged without budget": Case(["--model-path", nano, *dry, "--kv-pool", "paged"]),
        "engine kv too small": Case(["--model-path", nano, *dry, "--max-running-requests", "1", "--context-length", "100",
                                     "--min-kv-tokens", "101"]),
        # the start scripts
        "script nano": Case([nano, "--dry-run"], env=script_env, script="start_memt_nano.sh", unset=("CUDA_VISIBLE_DEVICES",)),
        "script flash": Case([flash8, "--dry-run", "--context-length", "8192"], env=script_env, script="start_memt_flash.sh",
                             unset=("CUDA_VISIBLE_DEVICES",)),
        "script flash as is": Case([flash8, "--dry-run"], env=script_env, script="start_memt_flash.sh"),
        "script nano env": Case([nano, "--dry-run", "--max-running-requests", "3", "--port", "31001"],
                                env={**script_env, "MEMT_PORT": "31999", "MEMT_STATE_DIRECTORY": "/srv/memt", "CUDA_VISIBLE_DEVICES": "3"},
                                script="start_memt_nano.sh"),
        "script without checkpoint": Case([], env=script_env, script="start_memt_nano.sh"),
        "script finds the venv": Case([nano, "--dry-run"], script="start_memt_nano.sh", unset=("MEMT_PYTHON", "CUDA_VISIBLE_DEVICES")),
        "bundled path given": Case(["--model-path", str(REPO / "memt_core" / "bundled" / "memt-tiny-demo"), *dry]),
    }


IN_PROCESS = {
    "merge all", "merge json", "defaults", "defaults + flags", "header overrides off", "header overrides true",
    "config merging", "override other keys", "override memt", "override not JSON", "override unknown runtime field",
    "override non-positive", "flag non-positive", "no threads", "prefill below chunk", "context beyond model", "missing checkpoint",
    "engine flag unused", "engine kv too small", "bundled default", "bundled path given", "nano tp 2", "nano dp attention",
    "flash tp without dp attention", "flash dp below tp", "ep beyond experts", "tp beyond heads", "nccl on cpu",
    "dp without dp attention", "backend not here", "chunked prefill on", "total below min kv", "fraction beyond one",
    "graphs both ways", "bf16 kv on float32", "paged without budget",
}


def _run_in_process(case: Case) -> Outcome:
    from memt_core.launch import main

    saved = dict(os.environ)
    os.environ.pop("SGLANG_ENABLE_REQUEST_HEADER_OVERRIDES", None)
    os.environ.update(case.env)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(case.argv)
            except SystemExit as exc:  # argparse errors
                code = exc.code if isinstance(exc.code, int) else 2
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return Outcome(code, out.getvalue(), err.getvalue())


def _run(case: Case, cwd: Path) -> Outcome:
    env = dict(os.environ)
    env.pop("SGLANG_ENABLE_REQUEST_HEADER_OVERRIDES", None)
    for name in case.unset:
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(case.env)
    if case.script:
        command = ["sh", str(SCRIPTS / case.script), *case.argv]
    else:
        command = [sys.executable, "-m", "memt_core.launch", *case.argv]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    return Outcome(done.returncode, done.stdout, done.stderr)


@pytest.fixture(scope="module")
def runs(checkpoints) -> dict[str, Outcome]:
    cases = _cases(checkpoints)
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {name: pool.submit(_run, case, checkpoints["cwd"]) for name, case in cases.items() if name not in IN_PROCESS}
        outcomes = {name: _run_in_process(cases[name]) for name in IN_PROCESS}
        return {**outcomes, **{name: future.result() for name, future in futures.items()}}


def _sha256(path: Path) -> str:
    return hashlib.sha256((path / "config.json").read_bytes()).hexdigest()


# ---------------------------------------------------------------------- --dry-run


def test_dry_run_prints_identity_and_engine_args(runs, checkpoints):
    out = runs["nano"].json()
    identity = out["launch_identity"]
    assert identity["model"] == "memt-nano" and identity["extra"]["model_type"] == "memt_qwen3_5_moe"
    assert identity["config_sha256"] == _sha256(checkpoints["nano"])
    assert identity["checkpoint_id"] == "tiny-random-nano"
    assert len(identity["extra"]["identity"]) == 64
    assert identity["sglang_version"] is None  # the spec's field for the serving engine's version: no SGLang here
    assert identity["extra"]["bundled_demo_model"] is False and identity["extra"]["checkpoint_path"] == str(checkpoints["nano"])
    assert identity["memt_runtime"] == {"max_sessions_per_rank": 64, "max_inflight_commits_per_rank": 4, "min_kv_tokens": 256}
    engine = out["engine_args"]
    assert engine["max_prefill_tokens"] == 16384 and engine["max_sessions_per_rank"] == 64
    assert engine["host"] == "127.0.0.1" and engine["port"] == 30000 and engine["enable_streaming_session"] is False
    assert engine["engine"] == "torch" and identity["extra"]["engine"] == "memt-torch" and identity["extra"]["engine_version"]
    assert engine["min_kv_tokens"] == 256 and engine["dtype"] in ("float32", "bfloat16")
    assert "sglang_args" not in out  # settings no engine takes are not echoed
    assert engine["torch_compile"] is False and runs["compiled"].json()["engine_args"]["torch_compile"] is True
    assert runs["one thread"].json()["engine_args"]["torch_threads"] == 1
    assert 1 <= runs["threads by default"].json()["engine_args"]["torch_threads"] <= max(1, os.cpu_count() - 1)
    assert runs["threads from OMP"].json()["engine_args"]["torch_threads"] == "torch's default (1)"

    flash = runs["flash"].json()
    assert flash["launch_identity"]["model"] == "memt-flash"
    assert flash["launch_identity"]["config_sha256"] == _sha256(checkpoints["flash"])
    assert flash["engine_args"]["engine"] == "torch"


def test_without_model_path_the_bundled_demo_is_served_loudly(runs):
    outcome = runs["bundled default"]
    extra = outcome.json()["launch_identity"]["extra"]
    assert extra["bundled_demo_model"] is True and extra["checkpoint_path"].endswith("memt-tiny-demo")
    assert "WARNING" in outcome.stderr and "BUNDLED TINY DEMO MODEL" in outcome.stderr and "--model-path" in outcome.stderr
    assert "WARNING" not in runs["nano"].stderr
    chosen = runs["bundled path given"]  # chosen on purpose: reported, not warned about
    assert chosen.json()["launch_identity"]["extra"]["bundled_demo_model"] is True and "WARNING" not in chosen.stderr


def test_start_scripts_use_the_project_venv_without_memt_python(runs):
    """Run from another directory with MEMT_PYTHON unset: the script finds .venv/bin/python (python3 has no torch in CI)."""
    outcome = runs["script finds the venv"]
    assert outcome.json()["engine_args"]["max_running_requests"] == 8


def test_dry_run_never_reads_weights(runs, checkpoints):
    out = runs["no weights"].json()
    assert out["launch_identity"]["config_sha256"] == _sha256(checkpoints["no_weights"])


def test_dry_run_prints_the_parallel_plan(runs):
    """Ranks, devices, what each holds and its share of the weights, from the safetensors headers (none read when the
    files are not safetensors: the plan is printed without the sizes)."""
    one = runs["nano"].json()["parallel"]
    assert one["world_size"] == 1 and len(one["ranks"]) == 1 and one["ranks"][0]["weights_gb"] == one["ranks"][0]["of_gb"]
    two = runs["nano tp 2"].json()
    plan = two["parallel"]
    assert plan["world_size"] == 2 and plan["dist_backend"] == "gloo" and plan["tp_size"] == 2
    assert [r["rank"] for r in plan["ranks"]] == [0, 1] and [r["holds"]["vocabulary rows"] for r in plan["ranks"]] == ["0-255 of 512", "256-511 of 512"]
    assert 0.5 < plan["ranks"][0]["weights_gb"] / plan["ranks"][0]["of_gb"] < 0.6  # the embedding and norms stay whole
    assert two["engine_args"]["ranks_served"] == 2 and two["engine_args"]["fused_decode"] is True  # reduce-then-add on ranks
    unread = runs["no weights"].json()["parallel"]
    assert unread["ranks"] is None and "weights_unread" in unread


def test_runtime_merge_order(runs):
    def runtime(name):
        return runs[name].json()["launch_identity"]["memt_runtime"]

    # defaults (1) → checkpoint (64/4/256) → --json-model-override-args → explicit flags
    assert runtime("defaults") == {"max_sessions_per_rank": 1, "max_inflight_commits_per_rank": 1, "min_kv_tokens": 1}
    assert runtime("defaults + flags") == {"max_sessions_per_rank": 1, "max_inflight_commits_per_rank": 5, "min_kv_tokens": 7}
    assert runtime("merge json") == {"max_sessions_per_rank": 10, "max_inflight_commits_per_rank": 4, "min_kv_tokens": 512}
    assert runtime("merge all") == {"max_sessions_per_rank": 3, "max_inflight_commits_per_rank": 4, "min_kv_tokens": 512}
    engine = runs["merge all"].json()["engine_args"]
    assert (engine["max_sessions_per_rank"], engine["max_inflight_commits_per_rank"], engine["min_kv_tokens"]) == (3, 4, 512)
    assert runs["header overrides off"].returncode == 0


# ---------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "name, names",
    [
        ("trust remote code", "trust.remote.code"),
        ("config merging", "--config"),
        ("header overrides 1", "SGLANG_ENABLE_REQUEST_HEADER_OVERRIDES"),
        ("header overrides true", "SGLANG_ENABLE_REQUEST_HEADER_OVERRIDES"),
        ("override other keys", "num_hidden_layers"),
        ("override memt", "memt_runtime"),
        ("override not JSON", "not valid JSON"),
        ("override unknown runtime field", "max_batch"),
        ("override non-positive", "min_kv_tokens"),
        ("flag non-positive", "max_sessions_per_rank"),
        ("no threads", "--torch-threads must be at least 1"),
        ("prefill below chunk", "chunk_tokens"),
        ("context beyond model", "context-length"),
        ("missing checkpoint", "does not exist"),
        ("engine unknown", "invalid choice: 'sglang'"),
        ("engine flag unused", "deterministic-communication is for multi-rank engines"),
        ("nano dp attention", "memt-nano is served with DP attention off"),
        ("flash tp without dp attention", "memt-flash's attention is not split across ranks: use --enable-dp-attention"),
        ("flash dp below tp", "--enable-dp-attention needs --tp-size equal to --dp-size"),
        ("ep beyond experts", "--ep-size \\(8\\) must divide the expert count \\(4\\)"),
        ("tp beyond heads", "--tp-size \\(8\\) must divide the"),
        ("nccl on cpu", "--dist-backend nccl needs CUDA"),
        ("dp without dp attention", "--dp-size 2 without --enable-dp-attention"),
        ("backend not here", "--attention-backend flashinfer: this engine has torch_native"),
        ("chunked prefill on", "--chunked-prefill-size must be -1"),
        ("total below min kv", "--max-total-tokens \\(1\\) is below the checkpoint's min_kv_tokens \\(2\\)"),
        ("fraction beyond one", "--mem-fraction-static must be in \\(0, 1\\]"),
        ("graphs both ways", "--disable-cuda-graph and --enable-cuda-graph contradict"),
        ("bf16 kv on float32", "--kv-cache-dtype bf16 keeps the KV cache in the compute dtype"),
        ("paged without budget", "--kv-pool paged allocates the KV budget at start: give --max-total-tokens"),
        ("engine kv too small", "min_kv_tokens \\(101\\).*--max-running-requests \\(1\\) × --context-length \\(100\\)"),
    ],
)
def test_refusals_exit_non_zero_naming_the_problem(runs, name, names):
    outcome = runs[name]
    assert outcome.returncode != 0, outcome.stdout
    assert outcome.stdout == ""  # no launch plan printed
    assert re.search(names, outcome.stderr), outcome.stderr
    assert "Traceback" not in outcome.stderr


# ---------------------------------------------------------------------- start scripts


def test_start_scripts_are_posix_sh():
    for script in ("start_memt_nano.sh", "start_memt_flash.sh"):
        assert subprocess.run(["sh", "-n", str(SCRIPTS / script)], capture_output=True).returncode == 0
        if shutil.which("dash"):
            assert subprocess.run(["dash", "-n", str(SCRIPTS / script)], capture_output=True).returncode == 0


def test_start_nano_script_settings(runs, checkpoints):
    outcome = runs["script nano"]
    engine = outcome.json()["engine_args"]
    assert "CUDA_VISIBLE_DEVICES=0,1\n" in outcome.stderr
    assert engine["host"] == "127.0.0.1" and engine["port"] == 30000 and engine["state_directory"] == "./memt-state"
    assert (engine["max_sessions_per_rank"], engine["max_inflight_commits_per_rank"], engine["min_kv_tokens"]) == (6, 2, 2048)
    assert engine["max_prefill_tokens"] == 16384 and engine["max_running_requests"] == 8
    assert engine["enable_streaming_session"] is False
    # the seed's budgets: 65,536 total tokens, a static fraction of 0.60, eager, chunked prefill and radix cache off
    assert (engine["max_total_tokens"], engine["mem_fraction_static"], engine["kv_cache_dtype"]) == (65536, 0.6, "auto")
    assert engine["kv_pool"] == "auto" and engine["kv_cache"].startswith("a paged pool")  # a budget, eager, compute-dtype KV
    assert (engine["chunked_prefill_size"], engine["disable_radix_cache"], engine["disable_cuda_graph"]) == (-1, True, True)
    assert outcome.json()["launch_identity"]["config_sha256"] == _sha256(checkpoints["nano"])
    ranks = outcome.json()["parallel"]  # the seed's TP/EP/DP 2/1/1, DP attention off; CPU ranks here
    assert (ranks["tp_size"], ranks["ep_size"], ranks["dp_size"], ranks["enable_dp_attention"]) == (2, 1, 1, False)
    assert ranks["dist_backend"] == "gloo" and [r["device"] for r in ranks["ranks"]] == ["cpu", "cpu"]
    assert [r["holds"]["attention heads"] for r in ranks["ranks"]] == ["0-1 of 4", "2-3 of 4"]


def test_start_flash_script_settings(runs):
    outcome = runs["script flash"]
    engine = outcome.json()["engine_args"]
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7\n" in outcome.stderr
    assert engine["host"] == "127.0.0.1" and engine["port"] == 30000 and engine["state_directory"] == "./memt-state"
    assert (engine["max_sessions_per_rank"], engine["max_inflight_commits_per_rank"], engine["min_kv_tokens"]) == (6, 1, 2048)
    assert engine["max_prefill_tokens"] == 16384 and engine["max_running_requests"] == 48
    assert engine["enable_streaming_session"] is True
    assert engine["context_length"] == 8192  # the extra argument overrode the script's 16384
    assert (engine["max_total_tokens"], engine["mem_fraction_static"], engine["kv_cache_dtype"]) == (65536, 0.7, "fp8_e4m3")
    assert engine["kv_cache"].startswith("grows per request")  # an FP8 cache is not the pool's
    ranks = outcome.json()["parallel"]  # the seed's 8/8/8 with DP attention: attention TP 1, one expert per rank
    assert (ranks["tp_size"], ranks["ep_size"], ranks["dp_size"], ranks["enable_dp_attention"]) == (8, 8, 8, True)
    assert ranks["attention_tp_size"] == 1 and len(ranks["ranks"]) == 8
    assert [r["holds"]["experts"] for r in ranks["ranks"]][:2] == ["0 of 8", "1 of 8"]
    assert [r["holds"]["dp_rank"] for r in ranks["ranks"]] == list(range(8))
    # the script's own 16384-token context is refused for the tiny checkpoint (max_position_embeddings 8192)
    refused = runs["script flash as is"]
    assert refused.returncode != 0 and "context-length" in refused.stderr


def test_start_script_environment_and_extra_arguments(runs):
    outcome = runs["script nano env"]
    engine = outcome.json()["engine_args"]
    assert "CUDA_VISIBLE_DEVICES=3\n" in outcome.stderr  # a preset value is honoured
    assert engine["state_directory"] == "/srv/memt"
    assert engine["port"] == 31001  # extra arguments come last and win over MEMT_PORT
    assert engine["max_running_requests"] == 3
    usage = runs["script without checkpoint"]
    assert usage.returncode == 2 and "usage" in usage.stderr


def test_help_states_each_default_once():
    """An option whose help already says its default gets no second "(default: …)" from argparse (issue 58)."""
    import re

    from memt_core.launch import build_parser

    text = build_parser().format_help()
    doubled = [block.split()[0] for block in re.split(r"\n  (?=-)", text) if block.count("(default") > 1]
    assert doubled == []
    assert "(default: 30000)" in text  # options that do not say it still get it
