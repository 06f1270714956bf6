"""The engine as the server sees it: ``utils.translation.engines.Engine``'s members, read once when the app is built.

``TorchEngine`` (a PyTorch run; with a ``decoder``, decoding in a process of its own) and ``CT2Model`` (a CTranslate2
export) have every member the server reads. Any other engine (a stand-in: the schema's model-less one, a test's) need
only have ``cfg`` and ``translate``; what it leaves out is read here as its default, so that the rest of the server
reads one typed object and never asks an engine whether it has something.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from tokenizer import Tokenizer
    from utils.config import Config
    from utils.run.ensemble import LoadedEnsemble
    from utils.run.load import LoadedRun
    from utils.serve.worker import ProcessDecoder
    from utils.translation.engines import Engine
    from utils.translation.translate import Translation

#: An engine's ``problem(decode, prefix, constraints, details)``: why it cannot decode so, in one line, or None.
Problem = Callable[[Any, bool, bool, bool], "str | None"]


@dataclass
class Served:
    """One engine's members, each with its default where the engine has none."""

    engine: Engine
    #: The PyTorch run it decodes (an ensemble's ``LoadedEnsemble``); None: an export.
    run: LoadedRun | None = None
    #: What it names tokens with and, if it has ``encode_src``, reads sources with (a run's, an export's); None: none.
    tokenizer: Tokenizer | Any = None
    #: An export's position limit (tokens of a source or target, eos included); None: none known (``positions``).
    max_length: int | None = None
    #: Its decoding process (a PyTorch run's, by default), which decodes for it; None: it decodes in the server.
    decoder: ProcessDecoder | None = None
    #: Whether requests join the decoding in flight in ``decoder`` (continuous batching) rather than whole batches.
    continuous: bool = False
    #: Why it cannot decode as asked (``Engine.problem``); None: it says nothing.
    problem: Problem | None = None
    #: The modes it declares (a stand-in with neither a run nor ``problem``).
    modes: tuple[str, ...] = ()
    #: An export's attention, kind -> layers (``CT2Model.attention_layers``); a run's comes from its config.
    attention_layers: dict[str, list[int]] = field(default_factory=dict)
    #: An export's ``cross_attention(text, target, decode)``: its last layer's, mean over heads; None: none.
    cross_attention: Callable[[str, str | None, Any], tuple[list[int], list[int], str, Any]] | None = None

    #: The members read from the engine (``of``).
    MEMBERS: ClassVar[tuple[str, ...]] = ("run", "tokenizer", "max_length", "decoder", "continuous", "problem",
                                          "modes", "attention_layers", "cross_attention")

    @classmethod
    def of(cls, engine: Engine) -> Served:
        """``engine``'s members; those it has not, their defaults."""
        served = cls(engine, **{name: getattr(engine, name) for name in cls.MEMBERS if hasattr(engine, name)})
        if served.run is not None:  # a run reads its sentences with its own tokenizer
            served.tokenizer = served.run.tokenizer
        served.continuous = bool(served.continuous and served.decoder is not None)
        return served

    @property
    def cfg(self) -> Config:
        return self.engine.cfg

    @property
    def ensemble(self) -> LoadedEnsemble | None:
        """The run when it is several decoded as one (``members``: each as loaded alone); None otherwise."""
        if self.run is None:
            return None
        from utils.run.ensemble import LoadedEnsemble

        return self.run if isinstance(self.run, LoadedEnsemble) and self.run.members else None

    @property
    def positions(self) -> int | None:
        """Its position limit: a run's model's, else ``max_length``."""
        return self.run.model.max_length if self.run is not None else self.max_length

    @property
    def kind(self) -> str:
        """``pytorch`` (a run) or ``ctranslate2`` (anything else: an export)."""
        return "pytorch" if self.run is not None else "ctranslate2"

    def translate(self, texts: list[str], decode: Any, on_done: Any = None, **extra: Any) -> list[list[Translation]]:
        """The engine's ``translate``; ``extra`` (``guides``, ``details``) only when there are, so that an engine that
        takes none is never handed any."""
        return self.engine.translate(texts, decode, on_done, **extra)
