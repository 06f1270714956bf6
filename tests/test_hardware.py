"""bench/hardware.py: peak FLOP/s from the instruction set, and model FLOPs against torch's own counter."""

import pytest
import torch

from bench.hardware import cpu_peak, cuda_peak, matrix_params, train_flops

ZEN4 = "vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel name\t: AMD EPYC\ncpu MHz\t\t: 2600.000\n" \
       "flags\t\t: fma avx avx2 avx512f avx512_bf16\n\nprocessor\t: 1\n"
SPR = "vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel name\t: Intel Xeon\ncpu MHz\t\t: 2000.000\n" \
      "flags\t\t: fma avx avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
OLD = "vendor_id\t: AuthenticAMD\ncpu family\t: 23\ncpu MHz\t\t: 3000.000\nflags\t\t: fma avx avx2\n"


def test_cpu_peak_follows_the_instruction_set() -> None:
    assert cpu_peak("fp32", 2, ZEN4).flops == pytest.approx(32 * 2 * 2600e6)  # 256-bit pipes on Zen 4
    assert cpu_peak("bf16", 2, ZEN4).flops == pytest.approx(64 * 2 * 2600e6)  # vdpbf16ps: 2x fp32
    assert cpu_peak("fp32", 2, SPR).flops == pytest.approx(64 * 2 * 2000e6)
    assert cpu_peak("bf16", 2, SPR).flops == pytest.approx(2048 * 2 * 2000e6)  # AMX
    no_bf16 = cpu_peak("bf16", 4, OLD)
    assert no_bf16.flops == pytest.approx(32 * 4 * 3000e6) and "no bf16 instructions" in no_bf16.formula
    assert "x 2 cores x 2600 MHz" in cpu_peak("fp32", 2, ZEN4).formula
    assert cpu_peak("fp32", 2, ZEN4, max_mhz=3000).flops == pytest.approx(32 * 2 * 3000e6)


def test_cuda_peak_by_name() -> None:
    assert cuda_peak("bf16", "NVIDIA H100 80GB HBM3").flops == pytest.approx(989e12)
    assert cuda_peak("fp32", "NVIDIA H200").flops == pytest.approx(67e12)
    assert cuda_peak("bf16", "Some GPU", 100).flops == pytest.approx(100e12)
    with pytest.raises(ValueError, match="--peak-tflops"):
        cuda_peak("bf16", "Some GPU")


def test_model_flops_of_a_training_step_match_torchs_flop_counter() -> None:
    """The analytic count (6N per token and attention, on the batch's real lengths) against
    torch.utils.flop_counter on a real forward and backward of our model (padding-free batch)."""
    from torch.utils.flop_counter import FlopCounterMode

    from models.transformer import Seq2SeqTransformer
    from utils.config import load_config

    cfg = load_config("configs/bench_small.yaml", ["model.dropout=0"]).model
    model = Seq2SeqTransformer(cfg, 1000, 0)
    src = torch.randint(3, 1000, (4, 20))
    tgt = torch.randint(3, 1000, (4, 15))
    with FlopCounterMode(display=False) as counter:
        model(src, tgt).float().sum().backward()
    counted = counter.get_total_flops()
    ours = train_flops(matrix_params(model), cfg.d_model, cfg.encoder_layers, cfg.decoder_layers, [(20, 15)] * 4)
    assert ours == pytest.approx(counted, rel=0.05)
    params = matrix_params(model)
    assert params["cross_kv"] == 3 * 512 * 256 and params["output"] == 256 * 1000


def test_run_flops_counts_the_batches_the_trainer_drew(tmp_path) -> None:
    """The batches run_flops reconstructs from a run directory are the trainer's: the same target tokens as
    train.py's own closing summary, across an epoch boundary (the demo epoch is 7 steps)."""
    from conftest import run_script

    from bench.hardware import run_flops
    from utils.run.layout import read_summary

    res = run_script("train.py", "--config", "configs/demo.yaml", "--runs", str(tmp_path), "--set",
                     "train.max_steps=10", "--set", "train.eval_every=100", "--set", "train.valid_bleu_sentences=2",
                     "--set", "model.d_model=32", "--set", "model.d_ff=64", "--set", f"data.cache_dir={tmp_path / 'c'}")
    assert res.returncode == 0, res.stderr
    run = next(p for p in tmp_path.glob("demo_2*") if p.is_dir())
    summary = read_summary((run / "train.log").read_text())
    counted = run_flops(run, summary["steps"])
    assert summary["steps"] == 10 and counted["target_tokens"] == summary["target_tokens"]
    assert counted["flops"] > 6 * counted["params"]["decoder"] * summary["target_tokens"]
