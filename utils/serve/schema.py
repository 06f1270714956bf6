"""The HTTP API's request and answer models: what FastAPI checks each request body against, and what the server's
OpenAPI schema (``GET /openapi.json``) says.

The request models are built for a server's own limits and decoding defaults (``request_models``), so that the schema
states them; what every body obeys whatever the limits (the checks across fields, and what it asks for) is in
``TranslateRules`` and ``AttentionRules``. A refusal is one line with its status (``utils/serve/refusals.py`` words
pydantic's first error; ``tests/test_docs_http.py`` sends requests to hold the schema and the refusals together).
The answer models describe what the endpoints return; the endpoints build plain dicts, which the tests validate
against these models.

No ``from __future__ import annotations``: pydantic reads the annotations of the request models, built inside
``request_models``, at runtime.
"""

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from utils.serve.body import json_type
from utils.serve.modes import MAX_PHRASES, SAMPLING, default_nbest, settings_problem
from utils.serve.refusals import NAME, RequestBody, by_shape, items, line

if TYPE_CHECKING:
    from utils.config import Config, DecodeConfig
    from utils.serve.limits import Limits
    from utils.translation.translate import Guide

KINDS = ("cross", "encoder", "decoder")
#: The fields of ``POST /translate`` that are decoding settings (``DecodeConfig``'s), over the server's.
DECODING = ("beam", "nbest", "lenpen", "sample", "temperature", "top_k", "top_p", "epsilon", "num_samples", "seed",
            "mbr", "mbr_utility", "no_repeat_ngram_size")

# Every refusal, status -> when (the answer is always ``{"error": "one line"}``).
ERRORS: dict[int, str] = {
    400: "the body is not JSON (invalid, empty, nested too deeply), not UTF-8, or a text holds a lone surrogate or a "
         "NUL character; or the client left before its request was complete",
    403: "the request names a host this server does not answer (`--allow-host`), or comes from a web page of another "
         "origin (`--allow-origin`)",
    404: "no such endpoint (the error names the endpoints there are)",
    405: "the endpoint does not take this method (e.g. `GET /translate`)",
    408: "the request did not arrive whole within `--request-timeout` seconds; the connection is closed",
    413: "too many lines (`--max-lines`), a line with too many characters (`--max-chars`) or tokens (`--max-tokens`), "
         "too much work (source tokens x beam over `--max-beam-tokens`, attention weights over "
         "`--max-attention-weights`), or a body over what those allow",
    415: "a POST body sent without `Content-Type: application/json`",
    422: "the body is not a JSON object; a field is unknown, missing, of the wrong type, empty or out of range; fields "
         "that do not go together (a sampling setting without sampling, constraints with greedy search...) or a mode "
         "the engine does not do (constraints with a CTranslate2 export); or the model cannot take the sentence, its "
         "prefix or its constraints (longer than its positions allow)",
    431: "the request line and headers hold more than `--max-header-bytes` bytes; the connection is closed",
    500: "an internal error (the first line of its message; the traceback goes to the server's log)",
    501: "a CTranslate2 export made before exports kept attention: `/attention` has nothing to draw (export the run "
         "again, or serve the run directory)",
    503: "the server is busy (`--max-queue` requests already wait, or `--max-connections` connections are open), or "
         "the decoding process ended while it held the request (the next request starts a new one): try again",
}


class ErrorAnswer(BaseModel):
    """Every refusal: an HTTP status of 4xx or 5xx and one readable line, never a traceback."""

    model_config = ConfigDict(extra="forbid")
    error: str = Field(description="what is wrong, in one line (e.g. `unknown field 'colour' (fields: text, target, "
                                   "kind, layer)`)")


class TranslateRules(RequestBody):
    """What every ``POST /translate`` body obeys, whatever the server's limits (``request_models`` gives the model its
    fields): the checks across fields, and what it asks for."""

    missing = {"text": "a sentence or a list of sentences"}
    #: The server's decoding settings: what a field left out, or null, keeps.
    server: ClassVar["DecodeConfig"]

    @property
    def single(self) -> bool:
        """Whether ``text`` is one string (the answer then has one line too)."""
        return isinstance(self.text, str)

    @property
    def lines(self) -> list[str]:
        return [self.text] if self.single else list(self.text)

    def given(self, name: str) -> bool:
        """Whether the body gives field ``name`` (null is not given)."""
        return name in self.model_fields_set and getattr(self, name) is not None

    def guides(self) -> "list[Guide] | None":
        """Each line's target prefix and constraints; None when the body has neither."""
        from utils.translation.translate import Guide

        if self.prefix is None and self.constraints is None:
            return None
        n = len(self.lines)
        prefixes = [self.prefix] * n if isinstance(self.prefix, str) else self.prefix or [""] * n
        phrases = self.constraints or [[]] * n
        if not isinstance(phrases[0], list):  # one list of phrases for every line
            phrases = [phrases] * n
        return [Guide(p.strip(), tuple(c.strip() for c in cs)) for p, cs in zip(prefixes, phrases, strict=True)]

    def settings(self) -> "DecodeConfig":
        """The server's decoding settings with the body's over them (``nbest`` left out: ``default_nbest``; MBR over
        samples: the candidates are ``mbr`` samples, whatever the server's ``num_samples``)."""
        own = {name: getattr(self, name) for name in DECODING if self.given(name)}
        decode = self.server.model_copy(update=own)
        if decode.mbr and decode.sample and not self.given("num_samples"):
            decode = decode.model_copy(update={"num_samples": 1})
        if not self.given("nbest"):
            decode = decode.model_copy(update={"nbest": default_nbest(self.server.nbest, decode)})
        return decode

    @model_validator(mode="after")
    def _goes_together(self) -> "TranslateRules":
        n = len(self.lines)
        lines = f"line{'s' * (n != 1)}"
        if isinstance(self.prefix, list) and len(self.prefix) != n:
            k = len(self.prefix)
            raise ValueError(f"prefix has {k} item{'s' * (k != 1)} but text has {n} {lines}: give one prefix per line "
                             '("" for none), or one string for every line')
        if self.constraints and isinstance(self.constraints[0], list) and len(self.constraints) != n:
            raise ValueError(f"constraints has {len(self.constraints)} lists but text has {n} {lines}: give one list "
                             "of phrases per line ([] for none), or one list of phrases for every line")
        decode = self.settings()
        sampling = [name for name in SAMPLING if self.given(name)]
        if sampling and not decode.sample:
            raise ValueError(f'{sampling[0]} applies to sampling: add "sample": true')
        if self.given("mbr_utility") and not decode.mbr:
            raise ValueError('mbr_utility applies to MBR decoding: add "mbr": N')
        why = settings_problem(decode, self.guides())
        if why is not None:
            raise ValueError(why)
        return self


class AttentionRules(RequestBody):
    """What every ``POST /attention`` body obeys, whatever the server's limits: a layer the model has, and one the
    engine draws."""

    missing = {"text": "the sentence whose attention is drawn"}
    #: The layers of each stack of the model served, ``encoder`` and ``decoder``.
    stacks: ClassVar[dict[str, int]]
    #: What the engine draws, kind -> layers (``utils.serve.app.attention_layers``; none: nothing, answered 501).
    drawn: ClassVar[dict[str, list[int]]]

    def place(self) -> tuple[str, int]:
        """The kind and the layer drawn, from 0 (a negative ``layer`` counts from the last)."""
        return self.kind, (-1 if self.layer is None else self.layer) % self.stacks[self.stack]

    @property
    def stack(self) -> str:
        return "encoder" if self.kind == "encoder" else "decoder"

    @model_validator(mode="after")
    def _drawn(self) -> "AttentionRules":
        n, layer = self.stacks[self.stack], -1 if self.layer is None else self.layer
        if not -n <= layer < n:
            raise ValueError(f"layer {layer}: the {self.stack} has {n} layers (0..{n - 1}, or -1 for the last)")
        if self.drawn and layer % n not in self.drawn.get(self.kind, []):
            what = ", ".join(f"{k} layer {' '.join(map(str, v))}" for k, v in self.drawn.items())
            raise ValueError(f"this CTranslate2 export gives only {what} (mean over heads): serve the run directory "
                             f"for {self.kind} layer {layer % n}")
        return self


def _no_bounds(field: dict[str, Any]) -> None:
    """A field's schema without the range of its integer (one that only keeps a number sane)."""
    for branch in field.get("anyOf", [field]):
        branch.pop("minimum", None)
        branch.pop("maximum", None)


def request_models(limits: "Limits", cfg: "Config",
                   attention: dict[str, list[int]]) -> tuple[type[TranslateRules], type[AttentionRules]]:
    """The request bodies of ``POST /translate`` and ``POST /attention`` for a server with these limits (its
    ``--max-*`` flags), decoding defaults (``cfg.decode``: the run's ``decode`` section with the decoding flags over
    it), model (``cfg.model``'s layers) and attention drawn (``attention``, kind -> layers)."""
    decode, chars = cfg.decode, limits.max_chars
    sentence = line(chars, "give a sentence to translate")
    sentences = items(sentence, 1, limits.max_lines, "give at least one sentence",
                      "{n} lines in one request, over the limit of {limit} (--max-lines)")
    start = line(chars, "give the text the translations start with")
    starts = items(line(chars, None), 1, limits.max_lines, 'give one prefix per line ("" for none)',
                   "{name} has {n} prefixes, over the limit of {limit} (--max-lines)")
    phrase = line(chars, "give a word or phrase the translation must contain")
    too_many = "{name} has {n} phrases, over the limit of {limit} a line"
    phrases = items(phrase, 1, MAX_PHRASES, "give the phrases, or leave the field out", too_many)
    per_line = items(items(phrase, None, MAX_PHRASES, "", too_many), 1, limits.max_lines,
                     "give the phrases, or leave the field out",
                     "{name} has {n} lists, over the limit of {limit} (--max-lines)")
    def text_or_list(value: Any) -> int | str:
        if isinstance(value, (str, list)):
            return 0 if isinstance(value, str) else 1
        return f"{NAME} must be a string or a list of strings, not {json_type(value)}"

    def one_or_per_line(value: Any) -> int | str:
        if not isinstance(value, list):
            return (f"{NAME} must be a list of phrases (for every line) or of lists of phrases (one per line), not "
                    f"{json_type(value)}")
        nested = [isinstance(v, list) for v in value]
        if any(nested) and not all(nested):
            return f"{NAME} must be a list of phrases or a list of lists of phrases, not both"
        return 1 if value and all(nested) else 0

    sampling = "; needs sampling (`sample` true, or the server's default); absent or null: the server's default"

    class TranslateRequest(TranslateRules):
        """What to translate, and optionally how."""

        server = decode
        model_config = ConfigDict(title="TranslateRequest", json_schema_extra={"examples": [
            {"text": "Le chat dort sur le canapé."},
            {"text": ["Bonjour.", "Merci beaucoup."], "beam": 5, "nbest": 2, "lenpen": 1.0},
            {"text": "Le chat dort sur le canapé.", "prefix": "The cat", "constraints": ["sofa"], "details": True},
            {"text": "Le chat dort sur le canapé.", "sample": True, "mbr": 16, "seed": 1}]})
        text: Annotated[sentence | sentences, by_shape(text_or_list, sentence, sentences)] = Field(
            description=f"a sentence, or a list of up to {limits.max_lines} (`--max-lines`); each line at most "
                        f"{limits.max_chars} characters (`--max-chars`) and {limits.max_tokens} tokens "
                        "(`--max-tokens`), not blank, no NUL character")
        beam: int | None = Field(decode.beam, ge=1, le=limits.max_beam,
                                 description="beam size (1: greedy search); absent or null: the server's default "
                                             "(`--beam`, else the run's `decode.beam`); at most `--max-beam`, and "
                                             "the lines' tokens times the beam at most "
                                             f"{limits.max_beam_tokens} (`--max-beam-tokens`)")
        nbest: int | None = Field(min(decode.nbest, decode.beam), ge=1, le=limits.max_beam,
                                  description="hypotheses returned per line, best first; at most `beam` (MBR: at "
                                              "most `mbr`; sampling without MBR returns `num_samples` and takes no "
                                              "`nbest` above 1); absent or null: the server's `--nbest` (at most "
                                              "`beam`, or `mbr`; 1 when sampling)")
        lenpen: float | None = Field(decode.lenpen, ge=0.0, le=10.0, description=(
            "GNMT length penalty alpha: hypotheses are ranked by log-probability / ((5 + length in tokens) / 6)^alpha, "
            "so a larger alpha favours longer ones and 0 ranks by log-probability alone (greedy search, beam 1, ranks "
            "nothing: unused); absent or null: the server's `--lenpen`"))
        prefix: Annotated[start | starts | None, by_shape(text_or_list, start, starts, null=True)] = Field(
            None, description=(
                "a target prefix: every translation starts with it (its tokens forced, kept in the output and counted "
                "in the scores); the search goes on after it. One string for every line, or a list aligned with "
                "`text` (`\"\"`: none for that line). Greedy or beam search, not sampling"))
        constraints: Annotated[phrases | per_line | None,
                               by_shape(one_or_per_line, phrases, per_line, null=True)] = Field(None, description=(
            f"terminology constraints: words or phrases every translation must contain (at most {MAX_PHRASES} a "
            "line), as a list of phrases for every line or a list of such lists aligned with `text` (`[]`: none for "
            "that line); beam search with dynamic beam allocation (`beam` 2 or more). A hypothesis that reaches the "
            "length cap without them all says so (`constraints_met` false). The prefix and phrases of a line at most "
            "`--max-tokens` tokens"))
        sample: bool | None = Field(decode.sample, description=(
            "draw the translations at random from the model's distribution instead of searching (`beam` unused): "
            "`num_samples` per line, best first by score; absent or null: the server's default (the run's "
            "`decode.sample`)"))
        temperature: float | None = Field(decode.temperature, gt=0, lt=100, description=(
            "divide the log-probabilities by it before drawing (below 1 sharper, above 1 flatter)" + sampling))
        top_k: int | None = Field(decode.top_k, ge=0, le=10**6, description=(
            "draw among the K most probable tokens only (0: off)" + sampling))
        top_p: float | None = Field(decode.top_p, gt=0, le=1, description=(
            "nucleus sampling: draw among the fewest most probable tokens of total probability P (1: off)" + sampling))
        epsilon: float | None = Field(decode.epsilon, ge=0, lt=1, description=(
            "epsilon sampling: draw among the tokens of probability at least E (0: off)" + sampling))
        num_samples: int | None = Field(decode.num_samples, ge=1, le=limits.max_beam, description=(
            "translations drawn per line, each a row of the batch as a beam is: the lines' tokens times the "
            f"samples at most {limits.max_beam_tokens} (`--max-beam-tokens`)" + sampling))
        seed: int | None = Field(decode.seed, ge=0, le=2**63 - 1, description=(
            "the samples of a line depend on this seed and the line alone, so the same seed repeats them exactly "
            "(a server started without `--seed`: a fresh seed each request)" + sampling))
        mbr: int | None = Field(decode.mbr, ge=0, le=limits.max_beam, description=(
            "minimum Bayes risk decoding over N candidates: N samples with sampling, else the beam's N-best (N at "
            "most `beam`); the translations are the distinct candidates ranked by their mean `mbr_utility` against "
            "all candidates (`utility`), `nbest` of them. 0: off; else at least 2; absent or null: the server's "
            "default"))
        mbr_utility: Literal["chrf", "bleu"] | None = Field(decode.mbr_utility, description=(
            "the utility of MBR decoding: sentence-level chrF or BLEU (sacreBLEU's); needs `mbr`; absent or null: "
            "the server's default"))
        no_repeat_ngram_size: int | None = Field(decode.no_repeat_ngram_size, ge=0, le=1024, description=(
            "never repeat an n-gram of this many tokens within a translation (a token that would complete one the "
            "translation already holds is blocked; a `prefix` is kept as given); not with `constraints`; 0: off; "
            "absent or null: the server's default (`--no_repeat_ngram_size`, else the run's "
            "`decode.no_repeat_ngram_size`)"))
        details: bool | None = Field(False, description=(
            "true: each hypothesis also gets its tokens, the log-probability of each (`token_logprobs`) and the "
            "source token each one attends to most (`alignment`), and each line its `source_tokens`, as "
            "`inference.py --format jsonl` writes them (a PyTorch run: one more teacher-forced pass of the model; a "
            "CTranslate2 export: from the attention it returns while decoding)"))

    class AttentionRequest(AttentionRules):
        """The sentence whose attention is drawn, and which attention."""

        stacks = {"encoder": cfg.model.encoder_layers, "decoder": cfg.model.decoder_layers}
        drawn = attention
        model_config = ConfigDict(title="AttentionRequest", json_schema_extra={"examples": [
            {"text": "Le chat dort.", "kind": "cross", "layer": -1},
            {"text": "Le chat dort.", "target": "The cat sleeps.", "kind": "encoder"}]})
        text: sentence = Field(description=f"the source sentence, at most {limits.max_chars} characters "
                                           f"(`--max-chars`) and {limits.max_tokens} tokens (`--max-tokens`); its "
                                           "attention weights over every layer and head at most "
                                           f"{limits.max_attention_weights} (`--max-attention-weights`)")
        target: sentence | None = Field(None, description="a translation to teacher-force (each row predicts its "
                                                          "next token), at most `--max-tokens` tokens; absent or "
                                                          "null: the model's greedy translation")
        kind: Literal["cross", "encoder", "decoder"] = Field(
            "cross", description="`cross` (decoder rows over source columns), `encoder` (source over source) or "
                                 "`decoder` (target over target) self-attention")
        # +-2^31 only keeps the number sane, unstated: the layers the model has are the bound (checked after)
        layer: int | None = Field(-1, ge=-(2**31), le=2**31, json_schema_extra=_no_bounds, description=(
            "the layer, from 0, of the stack `kind` belongs to (the decoder for `cross`); negative counts from the "
            "last (-1); absent or null: the last. `GET /model` lists the layers (`attention`); 422 for one the model "
            "does not have"))

    return TranslateRequest, AttentionRequest


# ---------------------------------------------------------------------------------------------- answers


class Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _no_default(field: dict[str, Any]) -> None:
    field.pop("default", None)


def absent(description: str) -> Any:
    """A field of an answer that is there or absent (never null): not required, no default in the schema."""
    return Field(None, description=description, json_schema_extra=_no_default)


class Hypothesis(Answer):
    """One hypothesis of a line's n-best list."""

    text: str = Field(description="the translation")
    score: float = Field(description="its log-probability divided by the GNMT length penalty (greedy search, beam 1: "
                                     "the log-probability itself): what the n-best list is sorted by (higher is "
                                     "better; under MBR the list is sorted by `utility`)")
    logprob: float = Field(description="its log-probability, summed over its tokens")
    utility: float = absent("MBR decoding: its mean utility (0-100) against all the candidates, itself included")
    constraints_met: bool = absent("a line with constraints: whether the hypothesis holds every phrase (false: it "
                                   "reached the length cap first)")
    tokens: list[str] = absent("`details`: its tokens, end-of-sentence last when it ended with one")
    token_logprobs: list[float] = absent("`details`: the log-probability of each token (the target prefix's too); "
                                         "their sum is `logprob`")
    alignment: list[int] = absent("`details`: for each token, the source position (into `source_tokens`) its last "
                                  "decoder layer's cross-attention weighs most, mean over heads (and over the models "
                                  "of an ensemble), the translation teacher-forced (a CTranslate2 export: as it "
                                  "decoded)")


class LineTranslation(Answer):
    """The translation of one line."""

    source: str = Field(description="the line, as sent")
    translation: str = Field(description="the best hypothesis (`nbest[0].text`)")
    nbest: list[Hypothesis] = Field(description="`nbest` hypotheses, best first (sampling: the samples; MBR: the "
                                                "distinct candidates of highest utility)")
    source_tokens: list[str] = absent("`details`: the line's tokens as the model reads it, end-of-sentence last")


class TranslateAnswer(Answer):
    """The n-best list of each line: the same texts and scores as `inference.py --input` with the same flags."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "translations": [{"source": "Le chat dort sur le canapé.", "translation": "The cat is sleeping on the sofa.",
                          "nbest": [{"text": "The cat is sleeping on the sofa.", "score": -0.2813,
                                     "logprob": -0.5067}]}],
        "beam": 5, "nbest": 1, "lenpen": 0.6, "sample": False, "mbr": 0, "no_repeat_ngram_size": 0, "details": False,
        "seconds": 0.0971}]})
    translations: list[LineTranslation] = Field(description="one per line sent, in order (one for a single string)")
    beam: int = Field(description="the beam size used")
    nbest: int = Field(description="the hypotheses returned per line (sampling: `num_samples`; MBR: at most)")
    lenpen: float = Field(description="the length penalty used")
    sample: bool = Field(description="whether the translations were sampled")
    temperature: float = absent("sampling: the temperature used")
    top_k: int = absent("sampling: the top-k used (0: off)")
    top_p: float = absent("sampling: the top-p used (1: off)")
    epsilon: float = absent("sampling: the epsilon used (0: off)")
    num_samples: int = absent("sampling: the samples drawn per line (with `mbr` and no `num_samples` asked: 1, the "
                              "candidates being `mbr`)")
    seed: int | None = Field(None, description="sampling: the seed used; null: a fresh one (absent without sampling)",
                             json_schema_extra=_no_default)
    mbr: int = Field(description="MBR decoding's candidates per line (0: off)")
    mbr_utility: str = absent("MBR decoding: its utility, `chrf` or `bleu`")
    no_repeat_ngram_size: int = Field(description="the size of the n-grams that never repeat within a translation "
                                                  "(0: none blocked)")
    details: bool = Field(description="whether the hypotheses carry their tokens, token log-probabilities and "
                                      "alignment")
    seconds: float = Field(description="seconds from the request's entering the queue to its answer: waiting "
                                       "behind other requests and decoding")


class AttentionAnswer(Answer):
    """One layer's attention weights for a sentence pair, as `visualize.py` computes them (rounded to 1e-5)."""

    source: str = Field(description="the source sentence")
    target: str = Field(description="the target sentence: the greedy translation, or the `target` sent")
    mode: Literal["greedy", "teacher-forced"] = Field(description="where `target` comes from")
    kind: Literal["cross", "encoder", "decoder"] = Field(description="the attention drawn")
    layer: int = Field(description="the layer drawn, from 0 (a negative `layer` resolved)")
    rows: list[str] = Field(description="the query tokens; for cross-attention the target token each row predicts "
                                        "(as in visualize.py's figures), ending with `</s>`")
    columns: list[str] = Field(description="the key tokens: the source tokens (cross, encoder) or the target "
                                           "tokens (decoder)")
    weights: list[list[float]] = Field(description="rows x columns, the mean over heads; each row sums to 1")
    heads: list[list[list[float]]] | None = Field(description="heads x rows x columns, each head's weights; null for "
                                                              "a CTranslate2 export (it gives the mean only)")


class EncodingInfo(Answer):
    """The run's positional encodings."""

    name: str = Field(description="a readable name, e.g. `sinusoidal`, `rope (ntk x4)`, `sinusoidal + alibi`")
    input_pe: str = Field(description="`model.input_pe`: the encoding added to the embeddings")
    attention_pe: str = Field(description="`model.attention_pe`: the encoding inside self-attention")
    cross_attention_pe: str = Field(description="`model.cross_attention_pe`: the encoding inside cross-attention")
    places: dict[str, str] = Field(description="each place (`encoder input`, `encoder self-attention`, `decoder "
                                               "input`, `decoder self-attention`, `cross-attention`) -> its encoding")


class SizeInfo(Answer):
    """The model's size."""

    parameters: int | None = Field(description="trainable parameters; null for a CTranslate2 export")
    d_model: int = Field(description="model width")
    n_heads: int = Field(description="attention heads per layer")
    d_ff: int = Field(description="feed-forward width")
    encoder_layers: int = Field(description="encoder layers")
    decoder_layers: int = Field(description="decoder layers")
    norm: str = Field(description="`pre` (layer norm before each sublayer, pre-LN) or `post`")


class TokenizerInfo(Answer):
    """The run's tokenizer."""

    type: str = Field(description="`tokenizer.type`")
    vocab_size: int | None = Field(description="the vocabulary's size")
    lowercase: bool = Field(description="whether text is lowercased before tokenizing")


class TrainingInfo(Answer):
    """Where the weights come from and how training went (what the run directory still has)."""

    run: str | None = Field(description="the run directory; for a CTranslate2 export, the run it was exported from "
                                        "(null if that is gone)")
    checkpoint: str | None = Field(description="the checkpoint file served (or exported)")
    step: int | None = Field(description="its training step; null for a CTranslate2 export")
    best_valid_bleu: float = absent("the best validation BLEU of the run (from its `last.pt`; PyTorch runs)")
    summary: dict[str, Any] = absent("the closing training summary (`summary.json`, else `train.log`'s closing line): "
                                     "steps, target_tokens, train_seconds, eval_seconds, target_tokens_per_s, "
                                     "valid_ppl, peak_rss_mb; absent while training runs")
    last_validation: str = absent("`train.log`'s last validation line, e.g. `valid loss 0.587 ppl 1.80 acc 0.924 "
                                  "BLEU 84.67 chrF 87.41`")
    quantization: str | None = absent("a CTranslate2 export's quantization, null when it kept the weights' type "
                                      "(only for an export)")


class DecodeDefaults(Answer):
    """The decoding defaults of every request (the run's `decode` section with the server's decoding flags over it)."""

    beam: int = Field(description="beam size")
    nbest: int = Field(description="hypotheses per line")
    lenpen: float = Field(description="GNMT length penalty alpha")
    max_len_a: float = Field(description="hypotheses are capped at a * source length + b tokens: a")
    max_len_b: int = Field(description="... and b")
    min_len_a: float = Field(description="end-of-sentence is blocked until a hypothesis has a * source length + b "
                                         "tokens (at most the cap; 0 and 0: no floor): a")
    min_len_b: int = Field(description="... and b")
    no_repeat_ngram_size: int = Field(description="n-grams of this many tokens never repeat in a translation (0: "
                                                  "off)")
    beam_stop: str = Field(description="when a sentence's beam search ends: `bound` (no alive beam can beat the "
                                       "finished n-best) or `k_finished` (after K finished hypotheses)")
    sample: bool = Field(description="whether translations are sampled")
    temperature: float = Field(description="sampling: the temperature")
    top_k: int = Field(description="sampling: top-k (0: off)")
    top_p: float = Field(description="sampling: top-p (1: off)")
    epsilon: float = Field(description="sampling: epsilon (0: off)")
    num_samples: int = Field(description="sampling: samples per line")
    seed: int | None = Field(description="sampling: the seed (null: a fresh one each request)")
    mbr: int = Field(description="MBR decoding's candidates (0: off)")
    mbr_utility: str = Field(description="MBR decoding's utility, `chrf` or `bleu`")


class LimitsInfo(Answer):
    """What one request may ask for, how requests are batched and queued, and what a connection may hold (the
    `--max-*` and `--request-timeout` flags)."""

    max_lines: int = Field(description="most lines in one `/translate` request (`--max-lines`)")
    max_chars: int = Field(description="most characters in one line (`--max-chars`)")
    max_tokens: int = Field(description="most tokens in one line as the model reads it: a `/translate` line, an "
                                        "`/attention` text or target (`--max-tokens`)")
    max_beam: int = Field(description="largest beam a request may ask for (`--max-beam`)")
    max_beam_tokens: int = Field(description="most source tokens x beam in one `/translate` request, over its lines "
                                             "(`--max-beam-tokens`)")
    max_attention_weights: int = Field(description="most attention weights one `/attention` request computes, over "
                                                   "every layer and head (`--max-attention-weights`)")
    max_batch: int = Field(description="most sentences decoded together (`--max-batch`)")
    max_wait_ms: float = Field(description="static batching: milliseconds the worker waits for more requests to join "
                                           "a batch (`--max-wait-ms`)")
    max_queue: int = Field(description="requests that may wait for the worker; one more is answered 503 "
                                       "(`--max-queue`)")
    max_connections: int = Field(description="connections open at once; one more is answered 503 and closed "
                                             "(`--max-connections`)")
    max_header_bytes: int = Field(description="bytes of one request's line and headers; more are answered 431 "
                                              "(`--max-header-bytes`)")
    request_timeout: float = Field(description="seconds a request has to arrive whole (else 408, connection closed), "
                                               "and a client to read its answer (`--request-timeout`)")


class EnsembleMember(Answer):
    """One model of an ensemble."""

    run_dir: str = Field(description="its run directory")
    checkpoint: str = Field(description="the checkpoint file loaded")
    step: int | None = Field(description="its training step")


class ModelAnswer(Answer):
    """The model served and how."""

    name: str = Field(description="the run's config name")
    engine: Literal["pytorch", "ctranslate2"] = Field(description="a PyTorch run or a CTranslate2 export")
    model_path: str = Field(description="`--model_path` as given")
    decoding: Literal["own process", "server process"] = Field(
        description="where the model decodes: a process of its own (a PyTorch run's default) or the server's "
                    "(`--decode-in-server`, a CTranslate2 export)")
    batching: Literal["continuous", "static"] = Field(
        description="`continuous`: requests join the decoding in flight between two decoder steps; `static`: "
                    "requests waiting together are decoded as one batch")
    attention: dict[str, list[int]] | None = Field(
        description="what `/attention` draws: kind -> layers (every kind and layer of a PyTorch run; a CTranslate2 "
                    "export: the last layer's cross-attention); null: nothing (an export made before exports kept "
                    "attention)")
    encoding: EncodingInfo = Field(description="the positional encodings")
    size: SizeInfo = Field(description="parameters, widths, layers")
    tokenizer: TokenizerInfo = Field(description="the tokenizer")
    training: TrainingInfo = Field(description="checkpoint, step, best validation BLEU, the training summary and the "
                                               "last validation line")
    decode: DecodeDefaults = Field(description="the decoding defaults of every request")
    modes: list[Literal["prefix", "constraints", "sample", "mbr", "details"]] = Field(
        description="the decoding modes `/translate` takes here: every one for a PyTorch run; a CTranslate2 export "
                    "those it does (a mode not listed is refused, 422)")
    ensemble: list[EnsembleMember] = absent("several runs decoded as one ensemble (the mean of their next-token "
                                            "probabilities): each one's run, checkpoint and step, the first one "
                                            "described above (its attention is what `/attention` draws); absent for "
                                            "one model")
    limits: LimitsInfo = Field(description="the server's limits")


class DecoderInfo(Answer):
    """A PyTorch run's decoding process."""

    pid: int = Field(description="its process id")
    restarts: int = Field(description="how many times it was started again after it ended")


class HealthAnswer(Answer):
    """The server is up; what its decoding worker has done since it started."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "status": "ok", "engine": "pytorch", "waiting": 0, "requests": 2, "sentences": 3, "batches": 2,
        "largest_batch": 2, "steps": 22, "step_sentences": 27, "busy_s": 0.3939, "rejected": 0, "abandoned": 0,
        "decoder": {"pid": 7240, "restarts": 0}}]})
    status: Literal["ok"] = Field(description="always `ok` (an answer means the server is up)")
    engine: Literal["pytorch", "ctranslate2"] = Field(description="a PyTorch run or a CTranslate2 export")
    waiting: int = Field(description="requests waiting for the decoding worker now")
    requests: int = Field(description="translation requests answered")
    sentences: int = Field(description="sentences translated")
    batches: int = Field(description="calls to the engine's translate; continuous batching: batches started")
    largest_batch: int = Field(description="sentences in the largest batch; continuous batching: the most sentences "
                                           "in flight at once")
    steps: int = Field(description="continuous batching: decoder steps run (0 with static batching)")
    step_sentences: int = Field(description="continuous batching: the sum over steps of the sentences decoding, so "
                                            "`step_sentences / steps` is the mean batch (0 with static batching)")
    busy_s: float = Field(description="seconds the engine has spent decoding (translations and attention maps), the "
                                      "call in progress included; continuous batching: the time with sentences in "
                                      "flight. Its share of a time span is how busy the model was")
    rejected: int = Field(description="requests answered 503 because the queue was full")
    abandoned: int = Field(description="requests whose client hung up before its answer: their work was dropped (out "
                                       "of the queue, out of the decoding in flight)")
    decoder: DecoderInfo = absent("a PyTorch run decoding in its own process: that process (absent otherwise)")
