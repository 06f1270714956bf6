"""bench/gpu_check.py (every encoding trained, cached decoding against full) on CPU."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_script


def test_the_check_trains_each_variant_and_compares_cached_with_full_decoding(tmp_path: Path) -> None:
    out = tmp_path / "check"
    only = "shaw + a,decoder cope,cross cope"
    res = run_script("bench/gpu_check.py", "--device", "cpu", "--amp", "none", "--steps", "3", "--sentences", "4",
                     "--config", "configs/demo.yaml", "--only", only, "--set", f"data.cache_dir={tmp_path / 'cache'}",
                     "--out", str(out))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    rows = {r["variant"]: r for r in json.loads((out / "gpu_check.json").read_text())["rows"]}
    assert list(rows) == ["decoder cope", "self shaw + a^V", "cross cope"]
    for name in ("decoder cope", "self shaw + a^V"):
        r = rows[name]
        assert r["ok"] and r["finite_loss"] and r["sentences"] == 4 and r["same_tokens"] == 4, r
        assert r["max_logprob_diff"] < 1e-3 and Path(r["run_dir"], "checkpoints", "last.pt").is_file()
    assert "causal (decoder) self-attention only" in rows["cross cope"]["skipped"]  # refused by validation: said
    table = (out / "gpu_check.md").read_text()
    assert "| self shaw + a^V | True |" in table and "| cross cope | not accepted:" in table

