"""Corpus sources: WIT3 archives/folders, the Hub path (offline), text folders, the demo corpus."""

from __future__ import annotations

import gzip
import html
import http.server
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest
from conftest import ROOT

from data.lines import Pairs
from data.sources import DEMO_DIR, DataError, corpus_fingerprint, hub_unreachable, load_corpus
from data.wit3 import load_wit3, parse_train_tags, parse_xml
from utils.config import DataConfig

YEARS = {"tst2010": 1664, "tst2011": 818, "tst2012": 1124, "tst2013": 1026, "tst2014": 1305}

# Two made-up talks in the train.tags layout: metadata lines (some indented) around the segments.
META = [
    '<doc docid="{id}" genre="lectures">',
    "<url>http://www.ted.com/talks/talk_{id}.html</url>",
    "<keywords>talks, science, {lang}</keywords>",
    "<speaker>Speaker {id}</speaker>",
    "<talkid>{id}</talkid>",
    "<title>Title {id} {lang}</title>",
    "<description>TED Talk Subtitles and Transcript: talk {id} ({lang})</description>",
    '  <reviewer href="http://www.ted.com/profiles/1">Reviewer {lang}</reviewer>',
    '<translator href="http://www.ted.com/profiles/2">Translator {lang}</translator>',
]
FR_SEGS = [f"Phrase numéro {i} du discours, avec R&amp;D et 3 < 4." for i in range(1, 21)]
EN_SEGS = [f"Sentence number {i} of the talk, with R&amp;D and 3 < 4." for i in range(1, 21)]


def _train_tags(segs: list[str], lang: str) -> str:
    lines = []
    for talk, chunk in ((1, segs[:12]), (2, segs[12:])):
        lines += [m.format(id=talk, lang=lang) for m in META]
        lines += [f"  {s} " for s in chunk]
        lines.append("</doc>")
    return "\n".join(lines) + "\n"


def _make_wit3_dir(root: Path, shared: Path) -> Path:
    folder = root / "fr-en"
    folder.mkdir(parents=True)
    for f in sorted((shared / "iwslt" / "2016-01" / "fr-en").glob("IWSLT16.TED.*.xml")):
        shutil.copy(f, folder / f.name.replace("IWSLT16", "IWSLT17"))
    (folder / "train.tags.fr-en.fr").write_text(_train_tags(FR_SEGS, "fr"), encoding="utf-8")
    (folder / "train.tags.fr-en.en").write_text(_train_tags(EN_SEGS, "en"), encoding="utf-8")
    return folder


@pytest.fixture
def wit3(tmp_path: Path, shared_data: Path) -> dict[str, Path]:
    """The same WIT3 release as an unpacked folder, fr-en.tgz and fr-en.zip (both holding fr-en/)."""
    unpacked = tmp_path / "unpacked"
    folder = _make_wit3_dir(unpacked, shared_data)
    tgz = tmp_path / "fr-en.tgz"
    with tarfile.open(tgz, "w:gz") as tf:
        tf.add(folder, arcname="fr-en")
    zpath = tmp_path / "fr-en.zip"
    with zipfile.ZipFile(zpath, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in sorted(folder.iterdir()):
            zf.write(f, f"fr-en/{f.name}")
    return {"parent": unpacked, "folder": folder, "tgz": tgz, "zip": zpath, "shared": shared_data}


def _regex_segments(path: Path) -> list[str]:
    """Independent reading of a WIT3 XML file: every <seg> text, unescaped, whitespace runs made one space."""
    text = path.read_text(encoding="utf-8")
    return [" ".join(html.unescape(m).split()) for m in re.findall(r"<seg id=\"\d+\">(.*?)</seg>", text)]


def _as_dict(dd: dict[str, Pairs]) -> dict[str, dict[str, list[str]]]:
    return {name: asdict(ds) for name, ds in dd.items()}


# ----------------------------------------------------------------------------------------------
# WIT3


def test_wit3_splits_and_contents(wit3: dict[str, Path]) -> None:
    dd = load_wit3(wit3["tgz"])
    assert list(dd) == ["train", "validation", "test", *YEARS]
    assert {name: len(ds) for name, ds in dd.items()} == {
        "train": 20, "validation": 887, "test": sum(YEARS.values()), **YEARS}
    # train: the made-up segments, stripped, metadata never a segment, no XML unescaping of plain text
    assert dd["train"]["src"] == [s.strip() for s in FR_SEGS]
    assert dd["train"]["tgt"] == [s.strip() for s in EN_SEGS]
    for side in ("src", "tgt"):
        assert not any(s.startswith("<") or "talkid" in s or "Reviewer" in s for s in dd["train"][side])
    # validation is dev2010 exactly, compared with an independent parse of the XML
    src_dir = wit3["shared"] / "iwslt" / "2016-01" / "fr-en"
    assert dd["validation"]["src"] == _regex_segments(src_dir / "IWSLT16.TED.dev2010.fr-en.fr.xml")
    assert dd["validation"]["tgt"] == _regex_segments(src_dir / "IWSLT16.TED.dev2010.fr-en.en.xml")
    assert dd["validation"]["src"][0].startswith("Vous savez, un des plaisirs intenses du voyage")
    assert dd["validation"]["tgt"][0].startswith("You know, one of the intense pleasures of travel")
    assert (dd["tst2010"]["src"][0], dd["tst2010"]["tgt"][0]) == ("Aujourd'hui tout le monde parle du bonheur.",
                                                                 "Everybody talks about happiness these days.")
    assert any("R&D" in s for s in dd["tst2010"]["tgt"]) and not any("&amp;" in s for s in dd["tst2010"]["tgt"])
    # test = tst2010..tst2014 concatenated in year order
    for side in ("src", "tgt"):
        assert dd["test"][side] == [s for year in YEARS for s in dd[year][side]]
        year_files = [src_dir / f"IWSLT16.TED.{y}.fr-en.{'fr' if side == 'src' else 'en'}.xml" for y in YEARS]
        assert dd["test"][side] == [s for f in year_files for s in _regex_segments(f)]


def test_wit3_archive_and_folder_forms_agree(wit3: dict[str, Path]) -> None:
    ref = _as_dict(load_wit3(wit3["zip"]))
    for key in ("tgz", "parent", "folder"):
        assert _as_dict(load_wit3(wit3[key])) == ref, key


def test_wit3_missing_train_file(wit3: dict[str, Path]) -> None:
    (wit3["folder"] / "train.tags.fr-en.en").unlink()
    with pytest.raises(DataError, match=r"train\.tags\.fr-en\.en"):
        load_wit3(wit3["folder"])
    (wit3["folder"] / "train.tags.fr-en.fr").unlink()
    with pytest.raises(DataError, match=r"train\.tags\.fr-en\.fr"):
        load_wit3(wit3["folder"])


def test_wit3_bad_path(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found"):
        load_wit3(tmp_path / "nope.tgz")
    bad = tmp_path / "broken.zip"
    bad.write_bytes(b"not a zip")
    with pytest.raises(DataError, match="broken.zip"):
        load_wit3(bad)


def test_parse_train_tags() -> None:
    fr = ["<url>u</url>", "  Bonjour  ", "   <talkid>3</talkid>", "a < b", "</doc>"]
    en = ["<url>u</url>", " Hello", "<talkid>3</talkid>", "a < b ", "</doc>"]
    assert parse_train_tags(fr, en) == [("Bonjour", "Hello"), ("a < b", "a < b")]
    with pytest.raises(DataError, match="misaligned at line 1"):
        parse_train_tags(["<url>u</url>", "x"], ["Hello", "<url>u</url>"])
    with pytest.raises(DataError, match="differ in length"):
        parse_train_tags(["a"], ["a", "b"])


def test_parse_xml_keys_and_escapes(tmp_path: Path) -> None:
    xml = (b'<?xml version="1.0" encoding="UTF-8"?>\n<mteval><srcset setid="x" srclang="french">\n'
           b'<doc docid="7" genre="lectures"><url>u</url><talkid>7</talkid>\n'
           b'<seg id="1">  R&amp;D &lt;ok&gt;  </seg>\n<seg id="2"> deux </seg></doc>\n'
           b'<doc docid="8"><seg id="1"> autre </seg></doc></srcset></mteval>\n')
    expected = {("7", "1"): "R&D <ok>", ("7", "2"): "deux", ("8", "1"): "autre"}
    assert parse_xml(xml) == expected
    (tmp_path / "f.xml").write_bytes(xml)
    assert parse_xml(tmp_path / "f.xml") == expected
    with pytest.raises(DataError, match="invalid XML"):
        parse_xml(b"<mteval><doc docid='1'><seg id='1'>x</doc>")


def test_wit3_pairs_by_docid_and_seg_id(wit3: dict[str, Path]) -> None:
    """Reordering the English segments of a talk must not change the pairing."""
    en = wit3["folder"] / "IWSLT17.TED.tst2011.fr-en.en.xml"
    text = en.read_text(encoding="utf-8")
    segs = re.findall(r"<seg id=\"\d+\">.*?</seg>\n", text)
    text = text.replace(segs[0] + segs[1], segs[1] + segs[0], 1)
    en.write_text(text, encoding="utf-8")
    dd = load_wit3(wit3["folder"])
    first = parse_xml(wit3["folder"] / "IWSLT17.TED.tst2011.fr-en.en.xml")
    docid = next(iter(first))[0]
    assert dd["tst2011"]["tgt"][0] == first[(docid, "1")]
    assert dd["tst2011"]["tgt"][1] == first[(docid, "2")]


# ----------------------------------------------------------------------------------------------
# iwslt2017 (Hub)


def test_iwslt2017_offline_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError) as info:
        load_corpus(DataConfig(source="iwslt2017"))
    msg = str(info.value)
    assert "\n" not in msg
    assert "offline" in msg and "data.source=wit3" in msg and "data.source=text" in msg


@pytest.fixture
def local_hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``HF_ENDPOINT`` pointed at an HTTP server on 127.0.0.1 that answers every request with 200 (no traffic
    leaves the machine); HF_HUB_OFFLINE unset."""
    class Ok(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield url
    server.shutdown()
    server.server_close()


def _closed_port() -> int:
    """A port of 127.0.0.1 nothing listens on (connections to it are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_hub_check_answers_fast_for_a_refusing_a_silent_and_a_live_endpoint(
        local_hub: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert hub_unreachable(timeout=2) is None  # the live local server answers
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    t0 = time.monotonic()
    refused = hub_unreachable(timeout=2)
    assert refused is not None and "unreachable" in refused and "refused" in refused.lower()
    assert time.monotonic() - t0 < 1.5  # one try, no retries
    with socket.socket() as silent:  # accepts connections (backlog) but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
        t0 = time.monotonic()
        reason = hub_unreachable(timeout=0.5)
        elapsed = time.monotonic() - t0
    assert reason is not None and "unreachable" in reason
    assert elapsed < 1.5, elapsed  # bounded by the timeout, not by the Hub client's retries


def test_iwslt2017_unreachable_hub_uses_the_cached_archive(wit3: dict[str, Path], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """HF_HUB_OFFLINE unset, the Hub refusing connections, the archive in the local Hugging Face cache: the cached
    copy is read at once; without it, the one-line error."""
    from huggingface_hub import constants

    cache = tmp_path / "hub_cache"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(DataError, match=r"^cannot download IWSLT2017 .*127\.0\.0\.1.* unreachable.*data\.source=wit3"):
        load_corpus(DataConfig(source="iwslt2017"))
    repo = cache / "datasets--IWSLT--iwslt2017"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    archive = repo / "snapshots" / commit / "data/2017-01-trnted/texts/fr/en/fr-en.zip"
    archive.parent.mkdir(parents=True)
    shutil.copy(wit3["zip"], archive)
    t0 = time.monotonic()
    dd = load_corpus(DataConfig(source="iwslt2017"))
    assert time.monotonic() - t0 < 15  # no retries first (they wait 23 s in all)
    assert _as_dict(dd) == _as_dict(load_wit3(wit3["zip"]))


def test_iwslt2017_unreachable_hub(local_hub: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def fail(**kwargs: object) -> str:
        raise LocalEntryNotFoundError("connection error")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fail)
    with pytest.raises(DataError, match=r"^cannot download IWSLT2017 .*unreachable.*data\.source=wit3"):
        load_corpus(DataConfig(source="iwslt2017"))


def test_iwslt2017_hub_archive(wit3: dict[str, Path], local_hub: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    calls = []

    def fake_download(**kwargs: object) -> str:
        calls.append(kwargs)
        return str(wit3["zip"])

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    dd = load_corpus(DataConfig(source="iwslt2017"))
    assert len(calls) == 1
    assert calls[0]["repo_id"] == "IWSLT/iwslt2017" and calls[0]["repo_type"] == "dataset"
    assert calls[0]["filename"] == "data/2017-01-trnted/texts/fr/en/fr-en.zip"
    assert _as_dict(dd) == _as_dict(load_wit3(wit3["zip"]))


# ----------------------------------------------------------------------------------------------
# text folders


def _write(path: Path, lines: list[str]) -> None:
    data = ("\n".join(lines) + "\n").encode("utf-8")
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


@pytest.fixture
def text_dir(tmp_path: Path) -> Path:
    d = tmp_path / "corpus"
    d.mkdir()
    _write(d / "train.fr", ["un chat", "", "deux\u2028chats", "  trois chats \r"])
    _write(d / "train.en", ["a cat", "nothing", "two\u2028cats", "three cats"])
    _write(d / "valid.fr.gz", ["bonjour", ""])
    _write(d / "valid.en.gz", ["hello", "empty"])
    _write(d / "test.tatoeba.fr", ["au revoir"])
    _write(d / "test.tatoeba.en", ["goodbye"])
    return d


def test_text_source(text_dir: Path) -> None:
    cfg = DataConfig(source="text", path=str(text_dir), test=["test.tatoeba"])
    dd = load_corpus(cfg)
    assert list(dd) == ["train", "validation", "test.tatoeba"]
    # train: the pair with an empty side is dropped; U+2028 does not break its line (it becomes a space)
    assert asdict(dd["train"]) == {"src": ["un chat", "deux chats", "trois chats"],
                                     "tgt": ["a cat", "two cats", "three cats"]}
    # evaluation splits stay aligned with their files: the empty pair is kept
    assert asdict(dd["validation"]) == {"src": ["bonjour", ""], "tgt": ["hello", "empty"]}
    assert asdict(dd["test.tatoeba"]) == {"src": ["au revoir"], "tgt": ["goodbye"]}


def test_text_source_errors(text_dir: Path) -> None:
    _write(text_dir / "test.tatoeba.en", ["goodbye", "extra"])
    cfg = DataConfig(source="text", path=str(text_dir), test=["test.tatoeba"])
    with pytest.raises(DataError, match=r"test\.tatoeba\.fr has 1 lines but .*test\.tatoeba\.en has 2"):
        load_corpus(cfg)
    cfg = DataConfig(source="text", path=str(text_dir), test=["test.missing"])
    with pytest.raises(DataError, match=r"file not found: .*test\.missing\.fr"):
        load_corpus(cfg)
    with pytest.raises(DataError, match="folder not found"):
        load_corpus(DataConfig(source="text", path=str(text_dir / "nope")))


def test_text_source_bench(shared_data: Path) -> None:
    cfg = DataConfig(source="text", path=str(shared_data / "bench" / "fr-en"),
                     test=["test.tatoeba", "test.iwslt-tst2010", "test.multi30k-2016"])
    dd = load_corpus(cfg)
    assert len(dd["validation"]) == 2640
    assert len(dd["test.tatoeba"]) == 1670
    assert len(dd["test.iwslt-tst2010"]) == 1664
    assert len(dd["test.multi30k-2016"]) == 1000
    assert len(dd["train"]) > 190_000


# ----------------------------------------------------------------------------------------------
# demo corpus and fingerprints


def test_demo_source() -> None:
    dd = load_corpus(DataConfig(source="demo"))
    assert list(dd) == ["train", "validation", "test"]
    for split, prefix in (("train", "train"), ("validation", "valid"), ("test", "test")):
        fr = (DEMO_DIR / f"{prefix}.fr").read_text(encoding="utf-8").rstrip("\n").split("\n")
        en = (DEMO_DIR / f"{prefix}.en").read_text(encoding="utf-8").rstrip("\n").split("\n")
        assert len(fr) == len(en) > 0, prefix
        pairs = [(" ".join(f.split()), " ".join(e.split())) for f, e in zip(fr, en, strict=True)]
        if split == "train":
            pairs = [(f, e) for f, e in pairs if f and e]
        ds = dd[split]
        assert len(ds) > 0
        assert list(zip(ds["src"], ds["tgt"], strict=True)) == pairs


def test_a_split_is_two_aligned_lists_read_without_pandas_or_arrow() -> None:
    """A corpus is a dict of ``Pairs``: ``len`` counts pairs, columns read by name or attribute, nothing else. Reading
    one loads no dataframe library (``datasets`` and its pandas cost about 2 s of every train.py and test.py start)."""
    train = load_corpus(DataConfig(source="demo"))["train"]
    assert isinstance(train, Pairs) and len(train) == len(train.src) == len(train.tgt) == 420
    assert train["src"] is train.src and train["tgt"] is train.tgt
    with pytest.raises(KeyError, match="'src' and 'tgt', not 0"):
        train[0]  # type: ignore[index]
    with pytest.raises(DataError, match="must align: 2 source lines but 1 target lines"):
        Pairs(["un", "deux"], ["one"])
    code = ("import importlib.util, sys; from data.config import DataConfig; from data.sources import load_corpus; "
            "load_corpus(DataConfig(source='demo'))\n"
            "for script in ('train.py', 'test.py'):  # their imports, as each start makes them\n"
            "    spec = importlib.util.spec_from_file_location(script[:-3] + '_script', script)\n"
            "    spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
            "print(sorted({'datasets', 'pandas', 'pyarrow'} & sys.modules.keys()))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out == "[]\n"


def test_fingerprint_tracks_files(text_dir: Path) -> None:
    cfg = DataConfig(source="text", path=str(text_dir), test=["test.tatoeba"])
    fp = corpus_fingerprint(cfg)
    assert len(fp) == 64 and fp == corpus_fingerprint(cfg)
    assert corpus_fingerprint(DataConfig(source="text", path=str(text_dir), test=[])) != fp
    assert corpus_fingerprint(DataConfig(source="text", path=str(text_dir), test=["test.tatoeba"],
                                         tgt_lang="fr", src_lang="en")) != fp
    f = text_dir / "train.en"
    st = f.stat()
    _write(f, ["a cat", "nothing", "two cats", "four cats"])  # same line count, new content
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert corpus_fingerprint(cfg) != fp
    assert len(corpus_fingerprint(DataConfig(source="demo"))) == 64
    hub = corpus_fingerprint(DataConfig(source="iwslt2017"))
    assert hub == corpus_fingerprint(DataConfig(source="iwslt2017")) != corpus_fingerprint(DataConfig(source="demo"))


def test_fingerprint_wit3(wit3: dict[str, Path]) -> None:
    cfg = DataConfig(source="wit3", path=str(wit3["parent"]))
    fp = corpus_fingerprint(cfg)
    assert corpus_fingerprint(DataConfig(source="wit3", path=str(wit3["tgz"]))) != fp
    xml = wit3["folder"] / "IWSLT17.TED.tst2012.fr-en.en.xml"
    xml.write_text(xml.read_text(encoding="utf-8").replace("the", "teh", 1), encoding="utf-8")
    assert corpus_fingerprint(cfg) != fp


def test_wit3_segments_and_train_tags_have_no_whitespace_runs(shared_data: Path) -> None:
    """IWSLT16 tst2010 keeps double spaces inside most XML segments; each would become a lone "▁" token."""
    xml = shared_data / "iwslt" / "2016-01" / "fr-en" / "IWSLT16.TED.tst2010.fr-en.fr.xml"
    raw = xml.read_text(encoding="utf-8")
    assert "  " in raw.split("<seg", 2)[2]  # the file itself has runs of spaces inside segments
    segs = parse_xml(xml)
    assert len(segs) == YEARS["tst2010"]
    assert not [t for t in segs.values() if "  " in t or t != t.strip()]
    pairs = parse_train_tags(["  deux  espaces\tet\u00a0tab\r", "<doc>"], ["two   spaces \r", "</doc>"])
    assert pairs == [("deux espaces et tab", "two spaces")]


def test_text_lines_are_cleaned_of_any_whitespace_run(tmp_path: Path) -> None:
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "train.fr").write_bytes("un  chat\r\ndeux\tchats \u2028 noirs\r\n".encode())
    (folder / "train.en").write_bytes(b"a cat\r\ntwo  black cats\n")
    for name in ("valid", "test"):
        (folder / f"{name}.fr").write_text("x\n", encoding="utf-8")
        (folder / f"{name}.en").write_text("y\n", encoding="utf-8")
    dd = load_corpus(DataConfig(source="text", path=str(folder)))
    assert dd["train"]["src"] == ["un chat", "deux chats noirs"]
    assert dd["train"]["tgt"] == ["a cat", "two black cats"]


@pytest.mark.parametrize("where", [0.1, 0.3, 0.5, 0.7, 0.9])
def test_a_damaged_archive_is_one_line_wherever_the_damage(wit3: dict[str, Path], where: float) -> None:
    for kind in ("zip", "tgz"):
        data = bytearray(wit3[kind].read_bytes())
        for i in range(int(len(data) * where), int(len(data) * where) + 64):
            data[i] ^= 0x5A
        bad = wit3[kind].with_name(f"damaged.{kind}")
        bad.write_bytes(bytes(data))
        try:
            load_wit3(bad)
        except DataError as e:
            assert "\n" not in str(e) and str(bad) in str(e), str(e)
        # (damage inside XML text can still parse: then there is no error to report)


def test_length_shifted_splits_join_consecutive_pairs(tmp_path):
    """``NAME.xK`` joins K consecutive pairs of NAME (the remainder left out); a file of that name wins."""
    from data.sources import concatenate_pairs, length_shifted, load_corpus
    from utils.config import load_config

    assert length_shifted("test.tatoeba.x4") == ("test.tatoeba", 4) and length_shifted("test.x") is None
    assert concatenate_pairs(["a", "b", "c"], ["A", "B", "C"], 2) == (["a b"], ["A B"])
    cfg = load_config("configs/demo.yaml", ["data.test=[test,test.x2,test.x3,test.x1]"])
    corpus = load_corpus(cfg.data)
    test = corpus["test"]
    assert len(corpus["test.x2"]) == len(test) // 2 and len(corpus["test.x3"]) == len(test) // 3
    for k in ("src", "tgt"):
        assert corpus["test.x2"][k][1] == f"{test[k][2]} {test[k][3]}"
    assert list(corpus["test.x1"]["src"]) == list(test["src"])
    for lang in ("fr", "en"):  # a text folder with a real file named like a shifted split: the file is read
        (tmp_path / f"t.{lang}").write_text("a\nb\n", encoding="utf-8")
        (tmp_path / f"t.x2.{lang}").write_text("own\n", encoding="utf-8")
        (tmp_path / f"train.{lang}").write_text("x\n", encoding="utf-8")
        (tmp_path / f"valid.{lang}").write_text("x\n", encoding="utf-8")
    cfg = load_config("configs/demo.yaml", ["data.source=text", f"data.path={tmp_path}", "data.test=[t,t.x2]",
                                            "data.validation=valid"])
    assert list(load_corpus(cfg.data)["t.x2"]["src"]) == ["own"]


def test_a_text_folders_validation_split_is_length_shifted_from_its_own_file_prefix(tmp_path):
    """``validation.x4`` in a text folder joins the pairs of the validation split, whatever its file prefix
    (``data.validation``, e.g. ``valid``): the split the length-controlled decoding is chosen on."""
    from data.sources import corpus_fingerprint, load_corpus
    from utils.config import load_config

    for lang in ("fr", "en"):
        (tmp_path / f"train.{lang}").write_text("x\n", encoding="utf-8")
        (tmp_path / f"valid.{lang}").write_text("".join(f"{lang}{i}\n" for i in range(9)), encoding="utf-8")
        (tmp_path / f"t.{lang}").write_text("a\n", encoding="utf-8")
    cfg = load_config("configs/demo.yaml", ["data.source=text", f"data.path={tmp_path}", "data.validation=valid",
                                            "data.test=[t,validation.x4,train.x1]"])
    corpus = load_corpus(cfg.data)
    assert list(corpus["validation.x4"]["src"]) == ["fr0 fr1 fr2 fr3", "fr4 fr5 fr6 fr7"]
    assert list(corpus["validation.x4"]["tgt"]) == ["en0 en1 en2 en3", "en4 en5 en6 en7"]
    assert list(corpus["train.x1"]["src"]) == ["x"] and len(corpus_fingerprint(cfg.data)) == 64
