"""Bad training input is refused before any message, in one line naming values and choices."""
from __future__ import annotations

import pytest

from mpiemu.config.errors import ConfigError
from mpiemu.runner.job import validate
from tests.conftest import our_lines, run_mpi

BASE = ["run.kind='train'", "model.preset='tiny'"]


def refusal(world: int, *sets: str) -> str:
    with pytest.raises(ConfigError) as exc:
        validate(None, [*BASE, *sets], world)
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_tp_that_does_not_divide_the_heads_names_the_valid_tp() -> None:
    msg = refusal(3, "parallel.tp=3")
    assert msg == ("parallel.tp=3: does not divide model.heads=8; choose tp in {1, 2, 4, 8}")


def test_tp_that_does_not_divide_the_hidden_size_is_refused() -> None:
    msg = refusal(4, "parallel.tp=4", "model.heads=4", "model.ffn_hidden=250")
    assert msg.startswith("parallel.tp=4: does not divide model.hidden=64 and "
                          "model.ffn_hidden=250; choose tp in {1, 2}")


def test_sequence_not_divisible_by_tp_under_sp_names_the_choices() -> None:
    msg = refusal(4, "parallel.tp=4", "parallel.sequence_parallel=true", "model.seq_len=18")
    assert msg.startswith("model.seq_len=18: is not divisible by parallel.tp=4 under "
                          "parallel.sequence_parallel; choose tp in {1, 2}")


def test_dp_that_does_not_divide_the_global_batch_names_the_valid_dp() -> None:
    msg = refusal(4, "parallel.dp=4", "train.global_batch=6")
    assert msg.startswith("train.global_batch=6: is not divisible by parallel.dp=4; choose dp "
                          "in {1, 2, 3, 6}")


def test_a_model_that_does_not_fit_is_reported_with_its_memory() -> None:
    msg = refusal(8, "model.preset='gpt3-175b'", "parallel.tp=8", "device.preset='h100-sxm5'",
                  "run.numerics='off'")
    assert msg.startswith("model.preset='gpt3-175b': does not fit on h100-sxm5 at tp=8, pp=1: "
                          "params 40.7 + grads 40.7 + optimizer 244")
    assert "GiB of 80 GiB (does NOT fit)" in msg and "memory_check='warn'" in msg


def test_memory_check_warn_lets_an_oversized_model_be_emulated() -> None:
    validate(None, [*BASE, "model.preset='gpt3-175b'", "parallel.tp=8", "run.numerics='off'",
                    "device.preset='h100-sxm5'", "train.memory_check='warn'"], 8)


def test_numerics_on_for_a_model_beyond_host_memory_is_refused() -> None:
    msg = refusal(8, "model.preset='gpt3-175b'", "parallel.tp=8", "train.memory_check='warn'")
    assert msg.startswith("run.numerics='on': needs ~") and "run.numerics='off'" in msg


@pytest.mark.parametrize("sets, needle", [
    (["model.preset='gpt-7'"], "model.preset='gpt-7': choose one of 'bert-large'"),
    (["model.heads=5"], "model.heads=5: does not divide model.hidden=64"),
    (["model.norm='sandwich'"], "model.norm='sandwich': choose one of 'pre', 'post'"),
    (["optimizer.name='sgd'"], "optimizer.name='sgd': choose one of 'adam', 'lamb'"),
    (["optimizer.beta2=1.5"], "optimizer.beta2=1.5: must be in [0, 1)"),
    (["train.check_reference=true", "run.numerics='off'"], "train.check_reference=True"),
    (["model.hidden_dropout=1.5"], "model.hidden_dropout=1.5: a rate in [0, 1)"),
    (["train.ddp='torch'"], "train.ddp='torch': choose one of 'core', 'local'"),
    (["train.ddp='local'"], "train.overlap_grad_reduce=True: false with train.ddp = 'local'"),
])
def test_model_and_optimizer_settings_are_checked(sets: list[str], needle: str) -> None:
    assert needle in refusal(1, *sets)


def test_bad_input_under_mpiexec_exits_2_with_one_line_on_rank_0(tmp_path) -> None:
    res = run_mpi(2, ["run", "workloads/quickstart.toml", "--set", "parallel.tp=1",
                      "--set", "parallel.dp=2", "--set", "train.global_batch=5",
                      "--out", str(tmp_path)])
    assert res.returncode == 2
    lines = our_lines(res.stderr)
    assert lines == ["mpiemu: error: train.global_batch=5: is not divisible by parallel.dp=2; "
                     "choose dp in {1, 5} or a global batch that is a multiple of 2"]


@pytest.mark.parametrize("world, sets, line", [
    (3, ["parallel.pp=3"], "parallel.pp=3: does not divide model.layers=2; choose pp in {1, 2}"),
    (2, ["parallel.pp=2", "parallel.schedule='interleaved'", "parallel.virtual_stages=2"],
     "parallel.virtual_stages=2: pp x virtual_stages = 4 does not divide model.layers=2; "
     "1 layer(s) per stage cannot be split; use parallel.schedule='1f1b'"),
    (1, ["train.micro_batch=3"], "train.micro_batch=3: does not divide the 8 sequences of each "
     "DP rank (global batch 8 / dp 1); choose one of {1, 2, 4, 8}"),
    (2, ["parallel.pp=2", "parallel.schedule='interleaved'", "parallel.virtual_stages=2",
         "model.layers=4", "train.micro_batch=8"],
     "train.micro_batch=8: gives 1 micro-batches per DP rank; the interleaved schedule needs "
     "a multiple of parallel.pp=2; choose micro_batch in {1, 2, 4}"),
    (1, ["train.recompute='some'"], "train.recompute='some': choose one of 'none', "
     "'selective', 'full'"),
    (4, ["parallel.tp=2", "parallel.pp=1"], "parallel.tp*parallel.dp*parallel.pp='2*1*1=2': "
     "must equal the 4 ranks of this job"),
    (1, ["parallel.schedule='zb'"], "parallel.schedule='zb': choose one of 'gpipe', '1f1b', "
     "'interleaved'"),
    (2, ["parallel.dp=2", "optimizer.zero=1", "optimizer.name='lamb'"],
     "optimizer.zero=1: needs optimizer.name='adam'"),
])
def test_pipeline_settings_are_refused_in_one_line(world: int, sets: list[str],
                                                   line: str) -> None:
    assert refusal(world, *sets).startswith(line)


LLAMA = ["model.preset='tiny-llama'", "model.attention='flash'"]


@pytest.mark.parametrize("world, sets, line", [
    (1, ["model.kv_heads=3"], "model.kv_heads=3: does not divide model.heads=8; choose "
     "kv_heads in {1, 2, 4, 8}"),
    (1, ["model.rope_scaling=0.5"], "model.rope_scaling=0.5: must be 0 (no scaling) or in "
     "[1, 1024]"),
    (6, ["parallel.cp=3", "parallel.dp=2"], "model.seq_len=16: is not "
     "divisible into 2 x parallel.cp = 6 chunks"),
    (2, ["parallel.cp=2", "model.attention='baseline'"],
     "model.attention='baseline': context parallelism runs flash attention"),
    (2, ["parallel.cp_comm='a2a'"], "parallel.cp_comm='a2a': choose one of 'p2p', "
     "'all_gather'"),
    (4, ["parallel.dp=4", "optimizer.zero=3", "optimizer.name='lamb'"], "optimizer.zero=3: needs "
     "optimizer.name='adam'"),
    (4, ["parallel.dp=4", "optimizer.zero=2", "train.overlap_grad_reduce=false"],
     "train.overlap_grad_reduce=False: must be true with optimizer.zero=2"),
    (4, ["parallel.dp=4", "optimizer.zero=1", "optimizer.prefetch=false"], "optimizer.prefetch=False: applies "
     "to optimizer.zero = 3 only"),
    (4, ["parallel.dp=4", "optimizer.zero=5"], "optimizer.zero=5: choose one of {0, 1, 2, 3}"),
    (4, ["parallel.dp=4", "optimizer.zero=3", "optimizer.overlap_param_gather=true"],
     "optimizer.overlap_param_gather=True: needs optimizer.zero = 1 or 2"),
    (2, ["parallel.pp=2", "model.layers=5", "parallel.first_stage_layers=3",
         "parallel.last_stage_layers=3"], "parallel.first_stage_layers=3: cannot place "
     "model.layers=5 on parallel.pp=2"),
])
def test_llama_cp_and_zero_settings_are_refused_in_one_line(world: int, sets: list[str],
                                                            line: str) -> None:
    assert refusal(world, *LLAMA, *sets).startswith(line)


def test_bad_cp_under_mpiexec_exits_2_with_one_line(tmp_path) -> None:
    res = run_mpi(2, ["run", "workloads/quickstart.toml", "--set", "model.preset='tiny-llama'",
                      "--set", "parallel.tp=1", "--set", "parallel.dp=1", "--set",
                      "parallel.cp=2", "--set", "model.seq_len=18", "--set",
                      "model.attention='flash'", "--out", str(tmp_path)])
    assert res.returncode == 2
    assert our_lines(res.stderr) == [
        "mpiemu: error: model.seq_len=18: is not divisible into 2 x parallel.cp = 4 chunks "
        "(context parallelism's causal balance); choose a multiple of 2 cp"]
