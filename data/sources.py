"""Corpus sources: every loader returns a ``dict`` of split name -> ``data.lines.Pairs`` (columns ``src``, ``tgt``).

Sources (``data.source``):

- ``demo``: the small corpus shipped in ``data/demo/`` ({train,valid,test}.{src,tgt}).
- ``text``: a folder of aligned plain-text files ``{name}.{lang}`` or ``{name}.{lang}.gz``.
- ``wit3``: a local WIT3 (IWSLT) archive or folder, see :mod:`data.wit3`.
- ``iwslt2017``: the raw WIT3 archive hosted by the Hub repo ``IWSLT/iwslt2017``, parsed like ``wit3``.

Length-shifted test sets: a test split named ``NAME.xK`` (e.g. ``test.tatoeba.x4``), when no file of that
name exists, is split ``NAME`` with every K consecutive pairs joined into one (source with source, target
with target, one space between), so its sentences are about K times as long with the same vocabulary and
style; the last ``len % K`` pairs are left out. Any source, any K >= 1 (``x1`` is the split itself).

Every line goes through ``clean_text`` (whitespace runs of any kind become one space). Empty lines: in
the ``train`` split a pair with an empty side is dropped and the
number dropped is logged. Evaluation splits are kept whole, so that row ``i`` always matches line
``i`` of the reference file; their empty pairs are only counted in a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from data.lines import DataError, Pairs, clean_text, make_split, read_lines

if TYPE_CHECKING:
    from data.config import DataConfig

logger = logging.getLogger("data")

DEMO_DIR = Path(__file__).resolve().parent / "demo"
HUB_REPO_ID = "IWSLT/iwslt2017"
HUB_FILENAME = "data/2017-01-trnted/texts/fr/en/fr-en.zip"
HUB_REVISION = "main"


def length_shifted(name: str) -> tuple[str, int] | None:
    """``"test.tatoeba.x4"`` -> ``("test.tatoeba", 4)``; None for a name without an ``.xK`` suffix."""
    m = re.fullmatch(r"(.+)\.x([1-9][0-9]*)", name)
    return (m.group(1), int(m.group(2))) if m else None


def concatenate_pairs(src: Sequence[str], tgt: Sequence[str], k: int) -> tuple[list[str], list[str]]:
    """Pairs ``k*i .. k*i+k-1`` joined into pair ``i`` (one space between sentences), ``len // k`` pairs."""
    n = len(src) // k
    return ([" ".join(src[i * k:(i + 1) * k]) for i in range(n)],
            [" ".join(tgt[i * k:(i + 1) * k]) for i in range(n)])


def _file_entry(path: Path) -> dict[str, object]:
    """Path, size and sha256 of a file's bytes: a content change cannot keep the fingerprint, whatever
    happens to its size and times (same-length edits, ``touch -r``, sync tools). About 0.4 GB/s."""
    path = path.resolve()
    try:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
        digest = h.hexdigest()
    except FileNotFoundError:
        raise DataError(f"file not found: {path}") from None
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror or type(e).__name__}") from None
    return {"path": str(path), "size": path.stat().st_size, "sha256": digest}


def _sha256_json(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=True).encode("utf-8")).hexdigest()


# ----------------------------------------------------------------------------------------------
# Plain-text folders (text and demo sources)


def _text_file(folder: Path, name: str, lang: str) -> Path:
    """``folder/name.lang``, else ``folder/name.lang.gz``; DataError naming the plain path if neither."""
    plain = folder / f"{name}.{lang}"
    if plain.is_file():
        return plain
    gz = folder / f"{name}.{lang}.gz"
    if gz.is_file():
        return gz
    raise DataError(f"file not found: {plain} (nor {gz.name})")


def _text_splits(cfg: DataConfig) -> tuple[Path, dict[str, str]]:
    """(folder, {split name: file prefix}) for the text and demo sources."""
    if cfg.source == "demo":
        return DEMO_DIR, {"train": "train", "validation": "valid", "test": "test"}
    if not cfg.path:
        raise DataError("data.path: required when data.source is 'text'")
    folder = Path(cfg.path).expanduser()
    if not folder.is_dir():
        raise DataError(f"data.path: folder not found: {folder}")
    splits = {"train": cfg.train, "validation": cfg.validation}
    for name in cfg.test:
        if name in splits:
            raise DataError(f"data.test: split name {name!r} clashes with the train/validation split")
        shifted = length_shifted(name)
        exists = any((folder / f"{name}.{cfg.src_lang}{gz}").is_file() for gz in ("", ".gz"))
        if shifted and not exists and shifted[0] in ("train", "validation"):
            continue  # joined from that split once it is read (_add_length_shifted), whatever its file prefix
        splits[name] = shifted[0] if shifted and not exists else name
    return folder, splits


def _load_text(cfg: DataConfig) -> dict[str, Pairs]:
    folder, splits = _text_splits(cfg)
    out = {}
    for split, prefix in splits.items():
        src_path = _text_file(folder, prefix, cfg.src_lang)
        tgt_path = _text_file(folder, prefix, cfg.tgt_lang)
        src, tgt = read_lines(src_path), read_lines(tgt_path)
        if len(src) != len(tgt):
            raise DataError(f"line counts differ: {src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}")
        if prefix != split and (shifted := length_shifted(split)) and shifted[0] == prefix:
            src, tgt = concatenate_pairs([clean_text(x) for x in src], [clean_text(x) for x in tgt], shifted[1])
        out[split] = make_split(split, src, tgt, origin=f"{folder / prefix}.{{{cfg.src_lang},{cfg.tgt_lang}}}")
    return out


# ----------------------------------------------------------------------------------------------
# Hugging Face Hub (IWSLT 2017)


def hub_unavailable_message(reason: str) -> str:
    """The one-line error shown when the IWSLT2017 archive cannot be fetched."""
    return (
        f"cannot download IWSLT2017 from the Hugging Face Hub ({reason}); use data.source=wit3 with "
        "data.path=<fr-en.tgz or folder> (a local WIT3 archive) or data.source=text with "
        "data.path=<folder of {split}.fr/.en files>"
    )


def _hub_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean "the Hub cannot be reached" for the installed huggingface_hub."""
    from huggingface_hub import errors

    names = ("LocalEntryNotFoundError", "OfflineModeIsEnabled", "HfHubHTTPError", "EntryNotFoundError")
    found: list[type[BaseException]] = [getattr(errors, n) for n in names if hasattr(errors, n)]
    for module in ("httpx2", "httpx", "requests"):
        try:
            mod = __import__(module)
        except ImportError:
            continue
        exc = getattr(mod, "HTTPError", None) or getattr(getattr(mod, "exceptions", None), "RequestException", None)
        if isinstance(exc, type) and issubclass(exc, BaseException):
            found.append(exc)
    found.append(OSError)  # socket/connection errors and a read-only cache
    return tuple(found)


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` is set to a true value (read now, not at import time)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _hub_cached_archive() -> Path | None:
    """The Hub archive if it is already in the local Hugging Face cache (no network), else None."""
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo_id=HUB_REPO_ID, repo_type="dataset", filename=HUB_FILENAME,
                                    revision=HUB_REVISION, local_files_only=True))
    except _hub_errors():
        return None


#: Seconds the reachability check of the Hub may take before the Hub counts as unreachable.
HUB_CHECK_TIMEOUT_S = 5.0


def hub_endpoint() -> str:
    """The Hub's base URL: ``HF_ENDPOINT`` as set now, else huggingface_hub's default."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def hub_unreachable(timeout: float = HUB_CHECK_TIMEOUT_S) -> str | None:
    """None if the Hub endpoint answers one HEAD request (any HTTP status) within ``timeout`` seconds, else why
    not, in a few words. One try, no retries: huggingface_hub's own client retries a dead connection for about
    half a minute, logging each try. Plain ``urllib`` (the environment's proxies apply), not huggingface_hub's
    session, which refuses every request once ``HF_HUB_OFFLINE`` was set when it was imported. The request runs in
    a thread so that a hanging DNS lookup is bounded too."""
    import threading
    import urllib.error
    import urllib.request

    endpoint = hub_endpoint()
    outcome: list[str | None] = []

    def probe() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout).close()
            outcome.append(None)
        except urllib.error.HTTPError:  # an answer, whatever its status: the Hub is reachable
            outcome.append(None)
        except Exception as e:  # any failure to get an HTTP answer: DNS, refused, timeout, proxy, TLS
            outcome.append(f"{endpoint} unreachable: {_error_words(e)}")

    thread = threading.Thread(target=probe, name="hub-check", daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    return outcome[0] if outcome else f"{endpoint} unreachable: no answer within {timeout:g} s"


def _error_words(e: BaseException) -> str:
    """A network error in a few words: the operating system's (``Connection refused``) where the chain has one."""
    import urllib.error

    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            return seen.strerror
        if isinstance(seen, urllib.error.URLError) and isinstance(seen.reason, BaseException):
            seen = seen.reason
            continue
        seen = seen.__cause__ or seen.__context__
    first = str(e).strip().splitlines()
    return first[0] if first else type(e).__name__


def check_hub(cfg: DataConfig) -> None:
    """For ``data.source=iwslt2017``: DataError, one line, within seconds, when the archive is neither cached nor
    downloadable now (what ``load_corpus`` would find out later). Other sources: nothing to check."""
    if cfg.source != "iwslt2017" or _hub_cached_archive() is not None:
        return
    if hub_offline():
        raise DataError(hub_unavailable_message("offline"))
    if (reason := hub_unreachable()) is not None:
        raise DataError(hub_unavailable_message(reason))


def download_iwslt2017() -> Path:
    """Local path of ``fr-en.zip`` from the Hub; DataError, one line, if it cannot be had.

    ``HF_HUB_OFFLINE=1``: the cached copy only. Otherwise one quick check that the Hub answers comes first
    (``hub_unreachable``): without it, the cached copy if there is one, else the error, in a few seconds.
    """
    from huggingface_hub import hf_hub_download

    offline = hub_offline()
    if not offline and (reason := hub_unreachable()) is not None:
        cached = _hub_cached_archive()
        if cached is None:
            raise DataError(hub_unavailable_message(reason))
        logger.info("%s; using the cached copy %s", reason, cached)
        return cached
    try:
        path = hf_hub_download(repo_id=HUB_REPO_ID, repo_type="dataset", filename=HUB_FILENAME,
                               revision=HUB_REVISION, local_files_only=offline)
    except _hub_errors() as e:
        reason = "offline" if offline else f"Hub unreachable: {type(e).__name__}"
        raise DataError(hub_unavailable_message(reason)) from None
    return Path(path)


# ----------------------------------------------------------------------------------------------
# Public entry points


def load_corpus(cfg: DataConfig) -> dict[str, Pairs]:
    """All splits of the corpus described by ``cfg``; each split has string columns ``src``, ``tgt``.

    Split names: ``train``, ``validation`` and the test splits (``test`` for demo; the names in
    ``cfg.test`` for text; ``test`` plus ``tst2010``... for wit3/iwslt2017).
    """
    from data.wit3 import load_wit3

    if cfg.source in ("demo", "text"):
        corpus = _load_text(cfg)
    elif cfg.source == "wit3":
        if not cfg.path:
            raise DataError("data.path: required when data.source is 'wit3'")
        corpus = load_wit3(cfg.path, cfg.src_lang, cfg.tgt_lang)
    elif cfg.source == "iwslt2017":
        if (cfg.src_lang, cfg.tgt_lang) != ("fr", "en"):
            raise DataError(f"data.source=iwslt2017 supports fr->en only, got {cfg.src_lang}->{cfg.tgt_lang}")
        corpus = load_wit3(download_iwslt2017(), cfg.src_lang, cfg.tgt_lang)
    else:
        raise DataError(f"data.source: unknown source {cfg.source!r}")
    return _add_length_shifted(corpus, cfg.test)


def _add_length_shifted(corpus: dict[str, Pairs], names: Sequence[str]) -> dict[str, Pairs]:
    """``corpus`` with each asked-for ``NAME.xK`` split it lacks made from its split ``NAME``."""
    for name in names:
        shifted = length_shifted(name)
        if name in corpus or shifted is None or shifted[0] not in corpus:
            continue
        base = corpus[shifted[0]]
        src, tgt = concatenate_pairs(list(base["src"]), list(base["tgt"]), shifted[1])
        corpus[name] = make_split(name, src, tgt, origin=f"{shifted[0]} x{shifted[1]}")
    return corpus


def corpus_fingerprint(cfg: DataConfig) -> str:
    """sha256 hex of what defines the corpus: the source kind, languages, split names and every input
    file's path and content hash, so any edit of a file changes it.
    """
    desc: dict[str, object] = {"source": cfg.source, "src_lang": cfg.src_lang, "tgt_lang": cfg.tgt_lang}
    if cfg.source in ("demo", "text"):
        folder, splits = _text_splits(cfg)
        desc["splits"] = splits
        desc["files"] = [
            _file_entry(_text_file(folder, prefix, lang))
            for prefix in splits.values()
            for lang in (cfg.src_lang, cfg.tgt_lang)
        ]
    elif cfg.source == "wit3":
        from data.wit3 import wit3_inputs

        if not cfg.path:
            raise DataError("data.path: required when data.source is 'wit3'")
        files, splits = wit3_inputs(cfg.path, cfg.src_lang, cfg.tgt_lang)
        desc["splits"] = splits
        desc["files"] = [_file_entry(p) for p in files]
    elif cfg.source == "iwslt2017":
        desc["hub"] = {"repo_id": HUB_REPO_ID, "filename": HUB_FILENAME, "revision": HUB_REVISION}
        local = _hub_cached_archive()
        if local is not None:  # a revision can move: key on the archive's bytes once it is here
            desc["files"] = [_file_entry(local)]
    else:
        raise DataError(f"data.source: unknown source {cfg.source!r}")
    return _sha256_json(desc)
