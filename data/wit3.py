"""Parsing the WIT3 (IWSLT) release formats: ``train.tags.*`` text files and ``*.TED.*.xml`` eval sets.

A WIT3 archive (``fr-en.tgz``/``fr-en.zip``) unpacks to ``fr-en/`` holding::

    train.tags.fr-en.fr / .en                   plain text; lines starting with '<' are talk metadata
    IWSLT17.TED.dev2010.fr-en.fr.xml / .en.xml  <doc docid=..><seg id="N"> text </seg>...
    IWSLT17.TED.tst2010..tst2015.fr-en.*.xml    same format

Splits follow the Hub's ``iwslt2017-fr-en``: train, validation (dev2010) and test (tst2010..tst2015
concatenated in year order); each tst year is also its own split (``tst2010``...).
"""

from __future__ import annotations

import io
import re
import tarfile
import xml.etree.ElementTree as ET
import zipfile
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath

from data.lines import DataError, Pairs, clean_text, decode_lines, make_split

ARCHIVE_SUFFIXES = (".tgz", ".tar.gz", ".zip")
TEST_YEARS = range(2010, 2016)  # the Hub's iwslt2017 test split: tst2010..tst2015


def parse_xml(path_or_bytes: str | Path | bytes) -> dict[tuple[str, str], str]:
    """Map (docid, seg id) -> unescaped segment text (``clean_text``) of a WIT3 ``*.xml`` file, in file order."""
    name = "<bytes>" if isinstance(path_or_bytes, bytes) else str(path_or_bytes)
    try:
        if isinstance(path_or_bytes, bytes):
            root = ET.parse(io.BytesIO(path_or_bytes)).getroot()
        else:
            root = ET.parse(str(path_or_bytes)).getroot()
    except FileNotFoundError:
        raise DataError(f"file not found: {name}") from None
    except ET.ParseError as e:
        raise DataError(f"{name}: invalid XML ({e})") from None
    segs: dict[tuple[str, str], str] = {}
    for doc in root.iter("doc"):
        docid = doc.get("docid")
        if docid is None:
            raise DataError(f"{name}: a <doc> has no docid attribute")
        for seg in doc.iter("seg"):
            seg_id = seg.get("id")
            if seg_id is None:
                raise DataError(f"{name}: a <seg> in doc {docid} has no id attribute")
            key = (docid, seg_id.strip())
            if key in segs:
                raise DataError(f"{name}: duplicate segment docid={docid} id={seg_id}")
            segs[key] = clean_text("".join(seg.itertext()))
    return segs


def pair_xml(src: dict[tuple[str, str], str], tgt: dict[tuple[str, str], str], name: str) -> list[tuple[str, str]]:
    """Pair two parsed XML files by (docid, seg id), in source order; every key must be on both sides."""
    missing = [k for k in src if k not in tgt]
    extra = [k for k in tgt if k not in src]
    if missing or extra:
        k = (missing or extra)[0]
        raise DataError(f"{name}: {len(missing)} source segments lack a translation and {len(extra)} translations "
                        f"lack a source (first: docid={k[0]} id={k[1]})")
    return [(text, tgt[key]) for key, text in src.items()]


def _is_meta(line: str) -> bool:
    return line.lstrip().startswith("<")


def parse_train_tags(lines_fr: Sequence[str], lines_en: Sequence[str]) -> list[tuple[str, str]]:
    """Parallel segments of ``train.tags`` files: drop metadata lines (starting with '<'), ``clean_text`` the rest.

    The French side decides what is metadata (as the Hub loader does); a metadata line facing a
    non-metadata English line means the files are misaligned (DataError).
    """
    if len(lines_fr) != len(lines_en):
        raise DataError(f"train.tags files differ in length: {len(lines_fr)} source vs {len(lines_en)} target lines")
    pairs = []
    for i, (fr, en) in enumerate(zip(lines_fr, lines_en, strict=True)):
        if _is_meta(fr):
            if not _is_meta(en):
                raise DataError(f"train.tags files misaligned at line {i + 1}: metadata {fr.strip()[:40]!r} "
                                f"faces text {en.strip()[:40]!r}")
            continue
        pairs.append((clean_text(fr), clean_text(en)))
    return pairs


# ----------------------------------------------------------------------------------------------
# Locating the files in an archive or a folder


class _Files:
    """The files of one WIT3 folder (inside an archive or on disk): basenames and a reader."""

    def __init__(self, names: list[str], read: Callable[[str], bytes], where: str,
                 close: Callable[[], None] = lambda: None) -> None:
        self.names = names
        self._read = read
        self.where = where
        self.close = close

    def read(self, name: str) -> bytes:
        """The bytes of one file; DataError, one line, if the archive or file is damaged or unreadable."""
        try:
            return self._read(name)
        except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError, zlib.error) as e:
            raise DataError(f"{self.where}/{name}: cannot read it, the archive or file is damaged "
                            f"({type(e).__name__})") from None


def _is_archive(path: Path) -> bool:
    return path.is_file() and path.name.lower().endswith(ARCHIVE_SUFFIXES)


def _train_name(src: str, tgt: str, lang: str) -> str:
    return f"train.tags.{src}-{tgt}.{lang}"


def _pick_dir(members: list[str], src: str, tgt: str, where: str) -> str:
    """The archive folder holding ``train.tags.{src}-{tgt}.{src}`` (shallowest, ignoring __MACOSX)."""
    want = _train_name(src, tgt, src)
    dirs = sorted(
        (str(PurePosixPath(m).parent) for m in members
         if PurePosixPath(m).name == want and "__MACOSX" not in PurePosixPath(m).parts),
        key=lambda d: (d.count("/"), d),
    )
    if not dirs:
        raise DataError(f"{where}: no {want} found (expected a WIT3 {src}-{tgt} archive unpacking to {src}-{tgt}/)")
    return dirs[0]


def _open_archive(path: Path, src: str, tgt: str) -> _Files:
    """Index a .zip/.tgz archive without extracting it; members are read on demand."""
    where = str(path)
    opened: zipfile.ZipFile | tarfile.TarFile | None = None
    try:
        if path.name.lower().endswith(".zip"):
            zf = opened = zipfile.ZipFile(path)
            members = [m for m in zf.namelist() if not m.endswith("/")]
            read_member: Callable[[str], bytes] = zf.read
        else:
            tf = opened = tarfile.open(path, "r:*")
            infos = {m.name.removeprefix("./"): m for m in tf.getmembers() if m.isfile()}
            members = list(infos)

            def read_member(name: str) -> bytes:
                f = tf.extractfile(infos[name])
                assert f is not None  # regular files only
                return f.read()

        folder = _pick_dir(members, src, tgt, where)
        prefix = "" if folder == "." else folder + "/"
        names = [m[len(prefix):] for m in members if m.startswith(prefix) and "/" not in m[len(prefix):]]
        return _Files(names, lambda n: read_member(prefix + n), where, opened.close)
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as e:
        if opened is not None:
            opened.close()
        detail = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise DataError(f"{where}: cannot read archive ({type(e).__name__}{': ' + detail if detail else ''})") from None
    except DataError:
        if opened is not None:
            opened.close()
        raise


def _find_folder(path: Path, src: str, tgt: str) -> Path:
    """The folder holding the WIT3 files: ``path`` itself or ``path/{src}-{tgt}``."""
    want = _train_name(src, tgt, src)
    for folder in (path, path / f"{src}-{tgt}"):
        if (folder / want).is_file():
            return folder
    raise DataError(f"no {want} in {path} or {path / f'{src}-{tgt}'} (expected a WIT3 archive or folder)")


def _open(path: str | Path, src: str, tgt: str) -> _Files:
    path = Path(path).expanduser()
    if _is_archive(path):
        return _open_archive(path, src, tgt)
    if path.is_dir():
        folder = _find_folder(path, src, tgt)
        names = sorted(p.name for p in folder.iterdir() if p.is_file())
        return _Files(names, lambda n: (folder / n).read_bytes(), str(folder))
    if path.exists():
        raise DataError(f"{path}: not a WIT3 archive ({', '.join(ARCHIVE_SUFFIXES)}) or folder")
    raise DataError(f"WIT3 path not found: {path}")


def _xml_sets(names: list[str], src: str, tgt: str) -> dict[str, tuple[str, str]]:
    """{set name (dev2010, tst2010...): (src xml, tgt xml)} for sets present in both languages.

    Any release prefix is accepted (IWSLT17, IWSLT16...); when several hold one set, the last in
    sorted order (the newest release) wins.
    """
    pattern = re.compile(rf"^(?P<prefix>.+)\.TED\.(?P<set>dev2010|tst\d{{4}})\.{re.escape(src)}-{re.escape(tgt)}"
                         rf"\.(?P<lang>{re.escape(src)}|{re.escape(tgt)})\.xml$")
    found: dict[tuple[str, str], str] = {}
    for name in sorted(names):
        m = pattern.match(name)
        if m:
            found[(m["set"], m["lang"])] = name  # sorted: a later prefix overrides
    return {s: (found[(s, src)], found[(s, tgt)]) for s, lang in found if lang == src and (s, tgt) in found}


def wit3_inputs(path: str | Path, src_lang: str = "fr", tgt_lang: str = "en") -> tuple[list[Path], list[str] | None]:
    """(input files, split names) for fingerprinting without reading data.

    An archive is one file whose splits are defined by its content (``None``); a folder lists its files.
    """
    p = Path(path).expanduser()
    if _is_archive(p):
        return [p], None
    files = _open(p, src_lang, tgt_lang)
    folder = Path(files.where)
    sets = _xml_sets(files.names, src_lang, tgt_lang)
    inputs = [folder / _train_name(src_lang, tgt_lang, lang) for lang in (src_lang, tgt_lang)]
    inputs += [folder / n for s in sorted(sets) for n in sets[s]]
    return inputs, _split_names(sets)


def _split_names(sets: dict[str, tuple[str, str]]) -> list[str]:
    names = ["train"]
    if "dev2010" in sets:
        names.append("validation")
    years = sorted(s for s in sets if s.startswith("tst"))
    if any(int(s[3:]) in TEST_YEARS for s in years):
        names.append("test")
    return names + years


def load_wit3(path: str | Path, src_lang: str = "fr", tgt_lang: str = "en") -> dict[str, Pairs]:
    """Load a WIT3 archive (.tgz/.tar.gz/.zip) or folder: each split two aligned lists, ``src`` and ``tgt`` (``Pairs``).

    Splits: ``train``, ``validation`` (dev2010), ``test`` (tst2010..tst2015 present, in year order)
    and each ``tstYYYY`` on its own.
    """
    files = _open(path, src_lang, tgt_lang)
    try:
        return _load_files(files, src_lang, tgt_lang)
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as e:
        raise DataError(f"{files.where}: cannot read archive ({type(e).__name__}: {e})") from None
    finally:
        files.close()


def _load_files(files: _Files, src_lang: str, tgt_lang: str) -> dict[str, Pairs]:
    have = set(files.names)
    train_names = [_train_name(src_lang, tgt_lang, lang) for lang in (src_lang, tgt_lang)]
    for n in train_names:
        if n not in have:
            raise DataError(f"{files.where}: missing {n} (expected {' and '.join(train_names)})")
    lines = [decode_lines(files.read(n), f"{files.where}/{n}") for n in train_names]
    train = parse_train_tags(lines[0], lines[1])

    sets = _xml_sets(files.names, src_lang, tgt_lang)
    pairs: dict[str, list[tuple[str, str]]] = {}
    for set_name in sorted(sets):
        s_name, t_name = sets[set_name]
        pairs[set_name] = pair_xml(parse_xml(files.read(s_name)), parse_xml(files.read(t_name)),
                                   f"{files.where}/{s_name}")

    def split(name: str, rows: list[tuple[str, str]], origin: str) -> Pairs:
        return make_split(name, [r[0] for r in rows], [r[1] for r in rows], origin)

    out = {"train": split("train", train, f"{files.where}/{train_names[0]}")}
    if "dev2010" in pairs:
        out["validation"] = split("validation", pairs["dev2010"], f"{files.where} dev2010")
    years = sorted(s for s in pairs if s.startswith("tst"))
    test_years = [s for s in years if int(s[3:]) in TEST_YEARS]
    if test_years:
        out["test"] = split("test", [p for s in test_years for p in pairs[s]], f"{files.where} {'+'.join(test_years)}")
    for s in years:
        out[s] = split(s, pairs[s], f"{files.where} {s}")
    return out
