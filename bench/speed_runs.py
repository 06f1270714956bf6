"""The measurements of bench/speed.py, each timed where it runs:

- in a worker process (bench/workers.py), on the inputs of bench/speed_inputs.py: a model's training step
  (``time_training``) and forced-length decoding (``time_decoding``) with its peak memory (``model_worker``),
  and the data path (``data_worker``: warm loads, cold tokenization of a synthetic corpus);
- from the parent: ``train.py`` itself (``time_real_loop``, with its achieved model FLOP/s) and a trained
  model's decoding, ours and its CTranslate2 export (``time_trained_decoding``, ``time_ctranslate2``).
"""

from __future__ import annotations

import contextlib
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import project_command
from bench.compare_models import SuppressEos, build_model, length_cap_processor
from bench.memory import MemoryMeter
from bench.speed_inputs import TEST_SPLIT
from utils.run.layout import RunDir


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def time_training(name: str, model: Any, batches: list[dict], warmup: int, precision: str, cfg: Any,
                  device: Any, pad: int) -> dict[str, Any]:
    import torch

    from utils.training.evaluation import token_loss

    t = cfg.train
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=t.lr, betas=tuple(t.betas), eps=t.eps, weight_decay=t.weight_decay)

    def autocast() -> contextlib.AbstractContextManager:
        return torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()

    if name == "marian":
        def forward(b: dict) -> torch.Tensor:
            return model(input_ids=b["src"], attention_mask=b["src_mask"], decoder_input_ids=b["dec_in"],
                         use_cache=False).logits
    else:
        def forward(b: dict) -> torch.Tensor:
            return model(b["src"], b["tgt_in"])

    def step(b: dict) -> torch.Tensor:
        with autocast():
            logits = forward(b)
        loss = token_loss(logits, b["tgt_out"], pad, t.label_smoothing) / b["n_tgt_tokens"]
        loss.backward()
        if t.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, t.clip_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    model.train()
    for b in batches[:warmup]:
        step(b)
    _sync(device)
    start = time.perf_counter()
    losses = [step(b) for b in batches[warmup:]]
    _sync(device)
    seconds = time.perf_counter() - start
    tokens = sum(b["n_tgt_tokens"] for b in batches[warmup:])
    return {"steps": len(batches) - warmup, "warmup": warmup, "tgt_tokens": tokens, "seconds": seconds,
            "tok_per_s": tokens / seconds, "loss_first": float(losses[0]), "loss_last": float(losses[-1])}


def time_decoding(name: str, model: Any, batches: list[dict], beam: int, use_cache: bool, cfg: Any,
                  device: Any, ids: dict[str, int]) -> dict[str, Any]:
    import torch

    from models.decoding import beam_search, greedy_search

    d = cfg.decode
    pad, bos, eos = ids["pad"], ids["bos"], ids["eos"]

    @torch.no_grad()
    def run(b: dict) -> int:
        src, cap = b["src"], b["cap"]
        if name == "marian":
            from transformers import LogitsProcessorList

            extra = {"early_stopping": True, "length_penalty": d.lenpen} if beam > 1 else {}
            out = model.generate(
                input_ids=src, attention_mask=src != pad, num_beams=beam, do_sample=False,
                max_new_tokens=int(cap.max()) + 1, num_return_sequences=1, use_cache=use_cache,
                logits_processor=LogitsProcessorList([length_cap_processor(cap, eos)]), **extra,
            )
            gen = out[:, 1:]
            return int(((gen == eos).cumsum(1) == 0).sum())
        wrapped = SuppressEos(model, eos)
        if beam == 1:
            hyps = greedy_search(wrapped, src, bos=bos, eos=eos, max_len_a=d.max_len_a, max_len_b=d.max_len_b,
                                 use_cache=use_cache)
            return sum(len(h.tokens) for h in hyps)
        nbest = beam_search(wrapped, src, bos=bos, eos=eos, beam=beam, nbest=1, lenpen=d.lenpen,
                            max_len_a=d.max_len_a, max_len_b=d.max_len_b, use_cache=use_cache)
        return sum(len(h[0].tokens) for h in nbest)

    model.eval()
    run({"src": batches[-1]["src"][:8], "cap": batches[-1]["cap"][:8]})  # warm-up
    _sync(device)
    start = time.perf_counter()
    generated = sum(run(b) for b in batches)
    _sync(device)
    seconds = time.perf_counter() - start
    sentences = sum(len(b["src"]) for b in batches)
    expected = sum(int(b["cap"].sum()) for b in batches)
    return {"beam": beam, "use_cache": use_cache, "sentences": sentences, "seconds": seconds,
            "sent_per_s": sentences / seconds, "generated_tokens": generated, "expected_tokens": expected,
            "gen_tok_per_s": generated / seconds}


def model_worker(spec: dict, cfg: Any) -> dict[str, Any]:
    import torch
    import transformers  # noqa: F401  (imported by every model worker, so that memory baselines are equal)

    device = torch.device(spec["device"])
    inputs = torch.load(spec["inputs"], weights_only=True)
    ids = inputs["ids"]
    name = spec["model"]
    if spec["task"] == "train":
        batches = []
        for b in inputs["train"]:
            b = {k: v.to(device) if torch.is_tensor(v) else v for k, v in b.items()}
            if name == "marian":
                b["src_mask"] = b["src"] != ids["pad"]
                b["dec_in"] = b["tgt_in"].clone()
                b["dec_in"][:, 0] = ids["pad"]  # Marian's decoder start token
            batches.append(b)
    else:
        batches = [{k: v.to(device) for k, v in b.items()} for b in inputs["decode"]]
    del inputs
    meter = MemoryMeter(device)
    meter.start()
    from utils.training.setup import set_seed

    set_seed(spec["seed"])
    model = build_model(name, cfg, ids["vocab"], ids["pad"], ids["eos"], spec["max_positions"]).to(device)
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if spec["task"] == "train":
        out = time_training(name, model, batches, spec["warmup"], spec["precision"], cfg, device, ids["pad"])
    else:
        beam = cfg.decode.beam if spec["task"] == "beam" else 1
        out = time_decoding(name, model, batches, beam, spec["use_cache"], cfg, device, ids)
    out.update(params=n_params, peak_mib=meter.peak_bytes() / 2**20, memory_method=meter.method,
               file_pages_mib=meter.file_growth / 2**20)
    return out


def synthetic_corpus(cfg: Any, pairs: int, seed: int) -> Any:
    """{"train": ``pairs`` bench training pairs, repeated and shuffled}, a corpus as ``load_corpus`` gives one."""
    import numpy as np

    from data.lines import make_split
    from data.sources import load_corpus

    train = load_corpus(cfg.data)["train"]
    src, tgt = train["src"], train["tgt"]
    order = np.random.default_rng(seed).permutation(np.resize(np.arange(len(src)), pairs)).tolist()
    return {"train": make_split("train", [src[i] for i in order], [tgt[i] for i in order], origin="synthetic")}


def data_worker(spec: dict, cfg: Any) -> dict[str, Any]:
    from data.cache import load_or_build
    from tokenizer import load_tokenizer

    tok = load_tokenizer(Path(spec["tokenizer"]))

    def no_corpus() -> Any:
        raise RuntimeError("expected a cache hit, but a split had to be built")

    task = spec["task"]
    if task == "data_warm":
        splits = ["train", TEST_SPLIT]
        loader = no_corpus
    else:
        data = cfg.data.model_copy(update=dict(cache_dir=spec["cache_dir"], num_proc=spec.get("num_proc", 1)))
        cfg = cfg.model_copy(update=dict(data=data))
        splits = ["train"]
        if task == "data_cold":
            corpus = synthetic_corpus(cfg, spec["pairs"], spec["seed"])
            loader = lambda: corpus
        else:
            loader = no_corpus
    def cpu_seconds() -> float:  # this process's threads plus finished worker processes
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    start, cpu_start = time.perf_counter(), cpu_seconds()
    out = load_or_build(cfg, tok, loader, splits)
    seconds = time.perf_counter() - start
    cores = (cpu_seconds() - cpu_start) / max(seconds, 1e-9)  # average number of busy cores
    return {"seconds": seconds, "cores_busy": cores, "splits": splits, "pairs": sum(len(s) for s in out.values()),
            "tokens": sum(len(s.src_tokens) + len(s.tgt_tokens) for s in out.values()),
            "num_proc": cfg.data.num_proc}


def time_real_loop(config: Path, overrides: list[str], steps: int, precision: str, device: str,
                   work: Path, profile_steps: int = 0, profile_after: int = 5, compile: bool = False) -> dict[str, Any]:
    """``train.py`` itself for ``steps`` optimizer steps (validation only once, at the end, on few sentences).

    Target tokens/s come from train.py's own closing summary (training steps only, batch assembly included);
    CPU user/system seconds, minor page faults and peak RSS from the kernel for the whole process
    (start-up, tokenizer and the final validation included). ``profile_steps``: then a second, shorter
    ``train.py`` (the same first batches) with torch.profiler over steps ``profile_after + 1 ..`` (the timed run
    is never profiled): ``phases``, ms per step by phase (utils/training/profile.py). ``tok_per_s_last``: the
    rate over the last third of the steps (train.py's logged window), past ``compile``'s first compilations.
    """
    from bench.measure import run_measured

    amp = ["train.amp=none"] if precision == "fp32" else ["train.amp=bf16", "train.amp_cpu=true"]
    sets = ["train.eval_every=100000000", "train.log_attention_every=0", "train.valid_bleu_sentences=20",
            f"train.device={device}", f"train.log_every={max(1, steps // 3)}", *overrides, *amp,
            f"train.compile={str(compile).lower()}"]

    def train_py(folder: str, max_steps: int, *extra: str) -> tuple[Any, Path]:
        """Run train.py into ``work/folder``; (its measurement, the run directory it wrote)."""
        cmd = project_command("train.py", "--config", config, "--runs", work / folder,
                              overrides=[f"train.max_steps={max_steps}", *sets, *extra])
        m = run_measured(cmd, work / f"{folder}.{precision}.log")
        runs = (p for p in (work / folder).iterdir() if p.is_dir() and not p.is_symlink())
        return m, max(runs, key=lambda p: p.stat().st_mtime)

    label = f"{precision}{', compiled' if compile else ''}"
    print(f"  train.py, {steps} steps, {label} ...", end="", flush=True)
    m, run = train_py("real", steps)
    summary = RunDir(run).summary()
    windows = RunDir(run).scalars("train/tokens_per_s")
    print(f" {summary['target_tokens_per_s']:.0f} tgt tok/s ({m.wall_s:.0f}s)", flush=True)
    out = {"tok_per_s": summary["target_tokens_per_s"], "steps": summary["steps"],
           "tok_per_s_last": windows[-1][1] if windows else None,
           "train_seconds": summary["train_seconds"], "wall_s": m.wall_s, "user_s": m.user_s, "sys_s": m.sys_s,
           "minor_faults": m.minor_faults, "peak_mib": m.peak_rss_mib}
    out.update(achieved_flops(run, summary, precision, device))
    if profile_steps and not compile:
        print(f"  train.py, {profile_steps} steps profiled after {profile_after}, {precision} ...", end="", flush=True)
        _, profiled = train_py("profiled", profile_after + profile_steps, f"train.profile_steps={profile_steps}",
                               f"train.profile_after={profile_after}")
        out["phases"] = RunDir(profiled).phases()["ms_per_step"]
        out["profile_trace"] = str(RunDir(profiled).profile)
        print(f" {sum(out['phases'].values()):.0f} ms/step", flush=True)
    return out


def achieved_flops(run: Path, summary: dict[str, Any], precision: str, device: str) -> dict[str, Any]:
    """Model FLOP/s of the run directory ``run`` over its training seconds, and its ratio to the peak of the
    device for the precision used (bench/hardware.py)."""
    import torch

    from bench.hardware import cpu_peak, cuda_peak, run_flops

    counted = run_flops(run, summary["steps"])
    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    peak = cuda_peak(precision, torch.cuda.get_device_name()) if cuda else cpu_peak(precision)
    achieved = counted["flops"] / summary["train_seconds"]
    return {"model_flops": counted["flops"], "flops_per_s": achieved, "peak_flops": peak.flops,
            "peak_fraction": achieved / peak.flops, "peak_formula": peak.formula, "flops_formula": counted["formula"]}


def _ct2_worker(folder: str, sources: list[str], decoders: dict[str, Any], threads: int) -> dict[str, Any]:
    """In a fresh process: time ``CT2Model.translate`` per decoder; label -> (seconds, texts, output tokens)."""
    from utils.translation.engines import CT2Model

    engine = CT2Model(folder, threads=threads)
    timed = {}
    for label, decode in decoders.items():
        engine.translate(sources[:8], decode)
        start = time.perf_counter()
        hyps = [best[0] for best in engine.translate(sources, decode)]
        timed[label] = (time.perf_counter() - start, [h.text for h in hyps], [len(h.tokens) for h in hyps])
    return timed


def time_ctranslate2(run: Any, sources: list[str], refs: list[str], decoders: dict[str, Any],
                     ours: dict[str, list[str]]) -> dict[str, Any]:
    """The same model exported to CTranslate2 (float32 and int8 weights), greedy and beam with the K-finished
    rule (CTranslate2's own): sent/s including tokenizing and detokenizing, as ours. Empty without ctranslate2.

    Timed in a fresh process, as ``inference.py --model_path EXPORT`` runs it: once PyTorch's CPU thread pool
    has run (our decoding, in this process), CTranslate2's own OpenMP threads compete with it and decode
    2-5x slower."""
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        print("  (ctranslate2 not installed: pip install '.[export]' to time the CTranslate2 export)", flush=True)
        return {}
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    import torch

    from utils.translation.export import export
    from utils.translation.scoring import corpus_scores

    out: dict[str, Any] = {}
    n = len(sources)
    ct2_decoders = {label: d for label, d in decoders.items() if not label.endswith("stop=bound")}
    with tempfile.TemporaryDirectory() as tmp:
        for quantization in (None, "int8"):
            folder = Path(tmp) / str(quantization)
            export(run.run_dir, run.checkpoint, run.model, run.cfg, run.tokenizer, folder, quantization)
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                try:
                    timed = pool.submit(_ct2_worker, str(folder), sources, ct2_decoders,
                                        torch.get_num_threads()).result()
                except BrokenProcessPool:  # the worker died (memory, a crash): no CTranslate2 rows, say why
                    print(f"  (the CTranslate2 {quantization or 'float32'} worker process died: not timed)", flush=True)
                    continue
            for label, (took, texts, lengths) in timed.items():
                name = f"CTranslate2 {quantization or 'float32'}, {label.split(',')[0]}"
                out[name] = {"sent_per_s": n / took, "seconds": took, "out_tokens": sum(lengths) / n,
                             "bleu": corpus_scores(texts, refs, run.cfg.tokenizer.lowercase).bleu,
                             # identical outputs: with our decoder of the same rule, and with our default rule
                             "same_as_ours": sum(a == b for a, b in zip(texts, ours[label], strict=True)),
                             "same_as_default": sum(a == b for a, b in zip(
                                 texts, ours[label.replace("k_finished", "bound")], strict=True))}
                print(f"  trained model, {name}: {n / took:.1f} sent/s", flush=True)
    return out


def time_trained_decoding(model_path: str, sentences: int, beam: int, device: str,
                          profile_to: Path | None = None, compile: bool = False) -> dict[str, Any]:
    """A trained model (a run directory) on the first ``sentences`` of TEST_SPLIT: greedy, then beam search
    with each stop rule; sentences/s (tokenizing, decoding, detokenizing), mean output tokens, sacreBLEU.

    ``compile``: greedy once more with the decoder step (``model.decode``) under ``torch.compile(dynamic=True)``,
    its first (compiling) call on 8 sentences timed apart as ``warmup_s``.

    ``profile_to``: also write torch.profiler's operator table of the beam search (``stop="bound"``).
    """

    from data.sources import load_corpus
    from utils.run.load import load_run
    from utils.translation.scoring import decode_and_score
    from utils.translation.translate import encode_sources, translate_ids

    run = load_run(model_path, device=device)
    split = load_corpus(run.cfg.data)[TEST_SPLIT]
    n = min(sentences, len(split))
    sources, refs = list(split["src"][:n]), list(split["tgt"][:n])
    decoders = {"greedy": run.cfg.decode.model_copy(update=dict(beam=1, nbest=1))}
    for rule in ("bound", "k_finished"):
        decoders[f"beam {beam}, stop={rule}"] = run.cfg.decode.model_copy(
            update=dict(beam=beam, nbest=1, beam_stop=rule))
    out: dict[str, Any] = {"model": str(run.checkpoint), "sentences": n, "lenpen": run.cfg.decode.lenpen,
                           "batch_size": run.cfg.decode.batch_size, "decoders": {}}
    texts: dict[str, list[str]] = {}
    for label, decode in decoders.items():
        decode_and_score(run.model, run.tokenizer, sources[:8], refs[:8], decode)  # warm-up
        scored = decode_and_score(run.model, run.tokenizer, sources, refs, decode, run.cfg.tokenizer.lowercase)
        texts[label] = scored.texts
        out["decoders"][label] = {"sent_per_s": n / scored.seconds, "seconds": scored.seconds,
                                  "out_tokens": sum(len(h.tokens) for h in scored.best) / n,
                                  "bleu": scored.scores.bleu}
        print(f"  trained model, {label}: {n / scored.seconds:.1f} sent/s", flush=True)
    if compile:
        import torch

        run.model.decode = torch.compile(run.model.decode, dynamic=True)  # an instance attribute: del restores
        start = time.perf_counter()
        decode_and_score(run.model, run.tokenizer, sources[:8], refs[:8], decoders["greedy"])
        warmup = time.perf_counter() - start
        scored = decode_and_score(run.model, run.tokenizer, sources, refs, decoders["greedy"],
                                  run.cfg.tokenizer.lowercase)
        del run.model.decode
        out["decoders"]["greedy, decoder step compiled"] = {
            "sent_per_s": n / scored.seconds, "seconds": scored.seconds, "warmup_s": warmup,
            "out_tokens": sum(len(h.tokens) for h in scored.best) / n, "bleu": scored.scores.bleu,
            "same_as_eager": scored.texts == texts["greedy"]}
        print(f"  trained model, greedy, decoder step compiled: {n / scored.seconds:.1f} sent/s "
              f"(first call {warmup:.0f} s)", flush=True)
    out["decoders"].update(time_ctranslate2(run, sources, refs, decoders, texts))
    if profile_to is not None:
        from torch.profiler import ProfilerActivity, profile

        decode = decoders[f"beam {beam}, stop=bound"]
        ids = encode_sources(run.tokenizer, sources, run.model.max_length, strict=False)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
            translate_ids(run.model, run.tokenizer, ids, decode)
        profile_to.write_text(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30) + "\n")
        print(f"  beam-search profile written to {profile_to}", flush=True)
    return out
