"""What the hardware can do and what a training step asks of it: peak FLOP/s and model FLOPs.

Peak, CPU (per core, per cycle, from the instruction set the kernel reports in /proc/cpuinfo):

    fp32: 2 (an FMA is two FLOPs) x SIMD lanes x FMA pipes
          AVX-512 on Intel: 16 lanes x 2 pipes = 64; AVX-512 on AMD Zen 4 (family 0x19) executes 512-bit
          operations on 256-bit pipes: 8 x 2 x 2 = 32; Zen 5 (family 0x1A): 16 x 2 x 2 = 64; AVX2+FMA: 8 x 2 x 2 = 32.
    bf16: AMX (amx_bf16): 1,024 bf16 multiply-adds per cycle per core = 2,048 FLOPs;
          AVX512-BF16 (vdpbf16ps, two products per fp32 lane): twice the fp32 rate; otherwise the fp32 rate
          (autocast then converts and computes in fp32).
    peak = FLOPs/cycle x cores (the processors this process may run on) x clock (cpuinfo_max_freq, else
    /proc/cpuinfo's "cpu MHz").

Peak, CUDA: the device's dense tensor-core bf16 and its fp32 (non-tensor) rate from a table of known parts,
else ``--peak-tflops``.

Model FLOPs of a training step (Kaplan et al. 2020; Chowdhery et al. 2022, appendix B), counted for an
encoder-decoder on the batch's real lengths: a multiply-add is 2 FLOPs, backward is twice forward, so

    train FLOPs = 3 x forward = 6 x ((P_enc + P_cross_kv) x S + (P_dec + P_out) x T) + 3 x attention,
    attention (forward, per layer) = 2 x 2 x d_model x (sum s^2 [encoder self] + sum t^2 [decoder self]
                                     + sum s t [cross]),

with S and T the batch's source and target tokens, s and t each pair's lengths, P the matrix parameters
that each token passes through (embeddings are lookups: not counted; the output projection is). The causal
mask's skipped half is counted, as PaLM's MFU does.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.common import usable_cores

# Dense (no sparsity) peak TFLOP/s: (bf16 tensor core, fp32 non-tensor), from the vendors' data sheets.
CUDA_PEAKS = {"H200": (989.0, 67.0), "H100 SXM": (989.0, 67.0), "H100 PCIe": (756.0, 51.0), "H100": (989.0, 67.0),
              "A100": (312.0, 19.5), "L40S": (362.0, 91.6), "L4": (121.0, 30.3), "A10": (125.0, 31.2)}


@dataclass
class Peak:
    """Peak FLOP/s of a device for one dtype, and how it was derived."""

    flops: float
    dtype: str
    formula: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cpu_features(cpuinfo: str | None = None) -> dict[str, Any]:
    """vendor, family, flags and clock (MHz) of the first processor in /proc/cpuinfo."""
    text = cpuinfo if cpuinfo is not None else Path("/proc/cpuinfo").read_text()
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if ":" not in line:
            if fields:
                break  # the first processor only
            continue
        key, value = (x.strip() for x in line.split(":", 1))
        fields.setdefault(key, value)
    return {"vendor": fields.get("vendor_id", ""), "family": int(fields.get("cpu family", "0") or 0),
            "model_name": fields.get("model name", ""), "flags": set(fields.get("flags", "").split()),
            "mhz": float(fields.get("cpu MHz", "0") or 0)}


def cpu_peak(dtype: str, cores: int | None = None, cpuinfo: str | None = None, max_mhz: float | None = None) -> Peak:
    """Peak FLOP/s of this CPU (or of ``cpuinfo``'s) for ``dtype`` ("fp32" or "bf16")."""
    f = cpu_features(cpuinfo)
    flags, amd = f["flags"], f["vendor"] == "AuthenticAMD"
    if "avx512f" in flags:
        lanes, pipes, isa = (8, 2, "AVX-512 on 256-bit pipes (Zen 4)") if amd and f["family"] == 0x19 \
            else (16, 2, "AVX-512, 2 FMA pipes")
    elif "avx2" in flags and "fma" in flags:
        lanes, pipes, isa = 8, 2, "AVX2+FMA, 2 pipes"
    else:
        lanes, pipes, isa = 4, 1, "SSE"
    per_cycle = 2 * lanes * pipes
    if dtype == "bf16":
        if "amx_bf16" in flags:
            per_cycle, isa = 2048, "AMX-BF16 (1,024 bf16 multiply-adds per cycle)"
        elif "avx512_bf16" in flags:
            per_cycle, isa = 2 * per_cycle, f"AVX512-BF16 (2x the fp32 rate of {isa})"
        else:
            isa += ", no bf16 instructions (bf16 computed in fp32)"
    if cores is None:
        cores = usable_cores()
    mhz, clock = max_mhz, "given"
    if mhz is None:
        try:
            mhz = int(Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text()) / 1000
            clock = "cpuinfo_max_freq"
        except (OSError, ValueError):
            mhz, clock = f["mhz"], "/proc/cpuinfo cpu MHz"
    flops = per_cycle * cores * mhz * 1e6
    return Peak(flops, dtype, f"{per_cycle} FLOPs/cycle/core [{isa}] x {cores} cores x {mhz:.0f} MHz ({clock})")


def cuda_peak(dtype: str, name: str, given_tflops: float | None = None) -> Peak:
    """Peak FLOP/s of a CUDA device by its name (``torch.cuda.get_device_name``), or ``given_tflops``."""
    if given_tflops:
        return Peak(given_tflops * 1e12, dtype, f"{given_tflops} TFLOP/s (given)")
    for part, (bf16, fp32) in CUDA_PEAKS.items():
        if part in name:
            tflops = bf16 if dtype == "bf16" else fp32
            return Peak(tflops * 1e12, dtype, f"{name}: {tflops} TFLOP/s dense {dtype} (data sheet)")
    raise ValueError(f"no known peak for {name!r}: give --peak-tflops")


def matrix_params(model: Any) -> dict[str, int]:
    """Parameters of the matrices a token passes through, per stack: encoder layers, decoder layers and the
    output projection (embedding lookups and 1-D parameters such as LayerNorm are not matrix work)."""
    out = {"encoder": 0, "decoder": 0, "cross_kv": 0, "output": 0}
    for name, p in model.named_parameters():
        if p.dim() < 2 or "embed" in name or ".pe." in name or "_pe." in name:
            continue
        if name.startswith("decoder") and "cross_attn.kv_proj" in name:
            out["cross_kv"] += p.numel()  # keys and values of the encoder's output: once per source token
        elif name.startswith("encoder"):
            out["encoder"] += p.numel()
        elif name.startswith("decoder"):
            out["decoder"] += p.numel()
    out["output"] = model.cfg.d_model * model.vocab_size  # tied or not, the projection is a d x V matmul
    return out


def train_flops(params: dict[str, int], d_model: int, enc_layers: int, dec_layers: int,
                pairs: Iterable[tuple[int, int]]) -> float:
    """Model FLOPs of one training step on a batch of (source length, target length) pairs (module docstring)."""
    pairs = list(pairs)
    s = sum(a for a, _ in pairs)
    t = sum(b for _, b in pairs)
    dense = (params["encoder"] + params.get("cross_kv", 0)) * s + (params["decoder"] + params["output"]) * t
    attention = 2 * 2 * d_model * (enc_layers * sum(a * a for a, _ in pairs)
                                   + dec_layers * sum(b * b + a * b for a, b in pairs))
    return 6.0 * dense + 3.0 * attention


def run_flops(run_dir: Path, steps: int) -> dict[str, Any]:
    """Model FLOPs of the first ``steps`` optimizer steps of the single-process run in ``run_dir``: its own
    config, tokenizer and data cache give the batches its trainer drew (epoch 1 onward, seeded), counted on
    their real lengths (eos on the source, bos on the target input; padding is not model work)."""
    from data.batching import TokenBatchSampler
    from data.cache import load_or_build
    from data.sources import load_corpus
    from models.transformer import Seq2SeqTransformer
    from tokenizer import load_tokenizer
    from utils.config import load_config
    from utils.run.layout import RunDir

    cfg = load_config(RunDir(run_dir).config)
    tok = load_tokenizer(RunDir(run_dir).tokenizer)
    train = load_or_build(cfg, tok, lambda: load_corpus(cfg.data), ["train"])["train"]
    sampler = TokenBatchSampler(train.src_lengths, train.tgt_lengths, cfg.data.max_tokens, True, cfg.seed)
    batches: list = []
    epoch = 1
    while len(batches) < steps * cfg.train.accumulate:
        batches += sampler.epoch_batches(epoch)
        epoch += 1
    model = Seq2SeqTransformer(cfg.model, tok.vocab_size, tok.pad_id)
    params = matrix_params(model)
    m = cfg.model
    total, target_tokens = 0.0, 0
    for batch in batches[: steps * cfg.train.accumulate]:
        pairs = [(int(train.src_lengths[i]) + 1, int(train.tgt_lengths[i]) + 1) for i in batch]
        total += train_flops(params, m.d_model, m.encoder_layers, m.decoder_layers, pairs)
        target_tokens += sum(t for _, t in pairs)
    return {"flops": total, "steps": steps, "params": params, "target_tokens": target_tokens,
            "formula": "6 x ((P_enc + P_cross_kv) x S + (P_dec + P_out) x T) + 3 x attention (bench/hardware.py)"}
