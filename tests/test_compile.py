"""train.compile: the compiled training forward trains the same model as eager (same seed, same dropout)."""

from __future__ import annotations

from conftest import assert_same_weights


def test_compiled_and_eager_training_agree(train_tiny) -> None:
    """Three real steps (dropout, label smoothing, Adam) each way, batches of changing shapes: the same weights
    up to float rounding (inductor fuses and reorders sums)."""
    from torch._dynamo.utils import counters

    eager = train_tiny("eager", max_steps=3, eval_every=3, compile=False)
    counters.clear()
    compiled = train_tiny("compiled", max_steps=3, eval_every=3, compile=True)
    assert counters["stats"]["unique_graphs"] > 0  # the second run really went through inductor
    assert_same_weights(compiled, eager)
