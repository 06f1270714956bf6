"""The command reference of the site: one page per command, generated from the command's argparse parser.

Each script builds its parser in a public ``build_parser()`` that its ``main()`` uses, so the pages list exactly the
options the command accepts: ``reference/commands/index.md`` (every command in one table) and
``reference/commands/<name>.md`` (the usage line, the description, every option as argparse groups them, and the
text after the options, such as inference.py's output formats).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
FOLDER = "reference/commands"
WIDTH = 100  # columns of the usage line (argparse wraps it to the terminal's width otherwise)


@dataclass(frozen=True)
class Command:
    """A command of the reference: its page name, its script (relative to the repository root), its section."""

    name: str
    script: str
    section: str
    summary: str = ""  # the index's line when the description's first paragraph is too long for it


SECTIONS = ("Training and translating", "Studies", "Benchmarks", "Documentation")
COMMANDS: tuple[Command, ...] = (
    Command("train", "train.py", SECTIONS[0]),
    Command("inference", "inference.py", SECTIONS[0]),
    Command("test", "test.py", SECTIONS[0]),
    Command("visualize", "visualize.py", SECTIONS[0]),
    Command("study", "bench/study.py", SECTIONS[1],
            "Train a grid of configurations x seeds at an equal budget, score every run, and report which "
            "differences are significant."),
    Command("study_report", "bench/study_report.py", SECTIONS[1]),
    Command("study_replay", "bench/study_replay.py", SECTIONS[1]),
    Command("pilot_rule", "bench/pilot_rule.py", SECTIONS[1]),
    Command("sequential_design", "bench/sequential_design.py", SECTIONS[1],
            "A group-sequential design: the looks at a study's seeds, the error each spends, their boundaries "
            "and the seeds its power needs."),
    Command("noise_ratio", "bench/noise_ratio.py", SECTIONS[1],
            "The noise pilot's endpoint: two studies' residual standard deviations, their ratio and its F interval."),
    Command("pilot_design", "bench/pilot_design.py", SECTIONS[1],
            "The second extrapolation study's design from its noise pilot: training arm, seeds, looks and the "
            "family file, by the rule fixed before the pilot was scored."),
    Command("study_stop", "bench/study_stop.py", SECTIONS[1],
            "Whether a group-sequential study has reached its declared stopping rule, from each look's results."),
    Command("study_unkept", "bench/study_unkept.py", SECTIONS[1],
            "What a study's runs not kept yet have cost so far, recorded before their machine may be replaced."),
    Command("sensitivity_decodings", "bench/sensitivity_decodings.py", SECTIONS[1],
            "A published study's primary tests again with its test-time decodings tested in their parent's place: "
            "a sensitivity analysis."),
    Command("arms_table", "bench/arms_table.py", SECTIONS[1],
            "The natural-length arm beside the short-trained arm: each system's length ratio and chrF at x1 to x8."),
    Command("same_training", "bench/same_training.py", SECTIONS[1],
            "Train a preset's systems with two checkouts of the code and compare their checkpoints bit for bit."),
    Command("length_study", "bench/length_study.py", SECTIONS[1]),
    Command("peers", "bench/peers.py", SECTIONS[2]),
    Command("speed", "bench/speed.py", SECTIONS[2]),
    Command("serve_load", "bench/serve_load.py", SECTIONS[2]),
    Command("batch_order", "bench/batch_order.py", SECTIONS[2],
            "What the order of sentences costs a batched decoder: batches in arrival order, length-sorted, and "
            "iteration-level (continuous) batching."),
    Command("decoding_modes", "bench/decoding_modes.py", SECTIONS[2],
            "Each decoding mode of inference.py (ensemble, sampling, MBR, prefix, constraints) against beam 5: "
            "sentences/s, BLEU, chrF."),
    Command("demo_page", "bench/demo_page.py", SECTIONS[2]),
    Command("gpu_check", "bench/gpu_check.py", SECTIONS[2]),
    Command("sdpa_backends", "bench/sdpa_backends.py", SECTIONS[2]),
    Command("generate-docs", "docs/generate.py", SECTIONS[3]),
)


def module_of(command: Command) -> ModuleType:
    """The command's script imported as a module (its ``main()`` does not run). Top-level scripts are loaded from
    their file under a name of their own (``test.py`` would otherwise be Python's own ``test`` package)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    dotted = command.script.removesuffix(".py").replace("/", ".")
    if "." in dotted:
        return importlib.import_module(dotted)
    name = f"_fr2en_command_{dotted}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / command.script)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


def parser_of(command: Command) -> argparse.ArgumentParser | None:
    """The command's parser, named ``python SCRIPT`` as the reference shows it; None for a script without
    ``build_parser()``."""
    build = getattr(module_of(command), "build_parser", None)
    if build is None:
        return None
    parser = build()
    parser.prog = f"python {command.script}"
    return parser


# ----------------------------------------------------------------------------------------------
# Text to Markdown


def _plain(text: str) -> str:
    """Prose as Markdown that shows it as written: HTML and Markdown's emphasis, link and table marks escaped."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([\\*_\[\]|])", r"\\\1", text)


def _code(text: str) -> str:
    """``text`` as an inline code span (longer backtick fences when it holds backticks)."""
    fence = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


OPTION = re.compile(r"(?<![\w-])(--[A-Za-z][\w-]*\w)")


def _inline(text: str) -> str:
    """A line of prose: ````code```` and ```code``` spans and option names (``--beam``) as code, the rest escaped."""
    out, pos = [], 0
    for m in re.finditer(r"``(.+?)``|`([^`]+)`", text):
        out += [_options(text[pos : m.start()]), _code(m.group(1) or m.group(2))]
        pos = m.end()
    return "".join(out) + _options(text[pos:])


def _options(text: str) -> str:
    parts = OPTION.split(text)  # odd items: the option names
    return "".join(_code(part) if i % 2 else _plain(part) for i, part in enumerate(parts))


def _blocks(text: str) -> str:
    """A docstring-style text as Markdown: a paragraph indented as a whole (commands, examples) becomes a code block,
    the others prose, their line breaks and list items kept."""
    out = []
    for para in re.split(r"\n[ \t]*\n", text.strip("\n")):
        lines = para.rstrip().split("\n")
        if all(line.startswith("    ") for line in lines):
            out.append("```text\n" + textwrap.dedent(para.rstrip()) + "\n```")
        else:
            out.append("\n".join(_inline(line.strip()) if not line.startswith("  ") else "  " + _inline(line.strip())
                                 for line in lines))
    return "\n\n".join(out)


def _relative(text: str) -> str:
    """Paths of this checkout written relative to it (defaults such as ROOT / "data" ...), for a page that does not
    depend on where the repository lies."""
    return text.replace(str(ROOT) + "/", "")


def _summary(description: str) -> str:
    """The first paragraph of a description, as one line."""
    first = re.split(r"\n[ \t]*\n", textwrap.dedent(description).strip())[0]
    return " ".join(first.split())


# ----------------------------------------------------------------------------------------------
# Options


def _help(action: argparse.Action, prog: str) -> str:
    """The action's help as ``--help`` prints it (``%(default)s`` and the like expanded)."""
    text = action.help or ""
    if "%" not in text:
        return text
    params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    params.update(prog=prog)
    for key, value in list(params.items()):
        if hasattr(value, "__name__"):
            params[key] = value.__name__
    if params.get("choices") is not None:
        params["choices"] = ", ".join(map(str, params["choices"]))
    return text % params


def _value(action: argparse.Action) -> str:
    """What follows an option on the command line, as argparse writes it (``N``, ``{a,b}``, ``N [N ...]``)."""
    if action.nargs == 0:
        return ""
    if action.metavar is not None:
        metavar = action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    elif action.choices is not None:
        metavar = "{" + ",".join(map(str, action.choices)) + "}"
    else:
        metavar = action.dest.upper()
    if isinstance(action.nargs, int):
        return " ".join([metavar] * action.nargs)
    forms = {"?": f"[{metavar}]", "*": f"[{metavar} ...]", "+": f"{metavar} [{metavar} ...]"}
    return forms.get(action.nargs, metavar)


def _default(action: argparse.Action) -> str:
    """The default, as a table cell: "required", "off"/"on" for flags, the value, or "-" for none."""
    if action.required:
        return "required"
    if isinstance(action, argparse._HelpAction | argparse._VersionAction):
        return ""
    if isinstance(action, argparse._StoreTrueAction):
        return "off"
    if isinstance(action, argparse._StoreFalseAction):
        return "on"
    value = action.default
    if value is None or value is argparse.SUPPRESS or value == []:
        return "-"
    if isinstance(value, list | tuple):
        return _code(" ".join(map(str, value)))
    return _code(_relative(str(value)))


def _row(action: argparse.Action, prog: str) -> str:
    flags = ", ".join(_code(s) for s in action.option_strings) if action.option_strings else _code(
        action.metavar if isinstance(action.metavar, str) else action.dest)
    value = _value(action) if action.option_strings else ""
    value = _code(value) if value else ""
    if isinstance(action, argparse._AppendAction | argparse._CountAction):
        value = f"{value} (repeatable)".strip()
    if not action.option_strings and action.nargs in ("+", "*"):
        value = "one or more" if action.nargs == "+" else "any number"
    text = _inline(" ".join(_relative(_help(action, prog)).split()))
    return f"| {flags} | {value} | {_default(action)} | {text} |"


def _group_title(title: str | None) -> str:
    title = title or "options"
    return _inline(title[:1].upper() + title[1:])


def command_page(command: Command, parser: argparse.ArgumentParser) -> str:
    """The reference page of one command."""
    description = _relative(parser.description or "")
    formatter_class = parser.formatter_class
    parser.formatter_class = functools.partial(formatter_class, width=WIDTH)  # not the terminal's width
    try:
        usage = _relative(parser.format_usage().strip())
    finally:
        parser.formatter_class = formatter_class
    lines = [
        f"# {command.script}",
        "",
        f"<!-- generated by docs/reference_cli.py from {command.script} (build_parser): do not edit; "
        "run python docs/generate.py -->",
        "",
    ]
    paragraphs = re.split(r"\n[ \t]*\n", textwrap.dedent(description).strip(), maxsplit=1)
    if paragraphs[0]:
        lines += [_blocks(paragraphs[0]), ""]
    lines += ["```text", usage, "```", ""]
    if len(paragraphs) > 1:
        lines += [_blocks(paragraphs[1]), ""]
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.help is not argparse.SUPPRESS]
        if not actions:
            continue
        lines += [f"## {_group_title(group.title)}", ""]
        if group.description:
            lines += [_inline(" ".join(group.description.split())), ""]
        first = "Option" if any(a.option_strings for a in actions) else "Argument"
        lines += [f"| {first} | Value | Default | Description |", "|---|---|---|---|"]
        lines += [_row(a, parser.prog) for a in actions]
        lines.append("")
        for mutex in parser._mutually_exclusive_groups:  # shown under the group that holds its options
            members = [a for a in mutex._group_actions if a.help is not argparse.SUPPRESS]
            if members and all(a in actions for a in members):
                names = ", ".join(_code(a.option_strings[0]) for a in members)
                rule = "give exactly one of them" if mutex.required else "give at most one of them"
                lines += [f"{names} exclude each other: {rule}.", ""]
    if parser.epilog:
        lines += [_heading_first(_relative(parser.epilog)), ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _heading_first(epilog: str) -> str:
    """An epilog whose first line reads ``Title (note):`` or ``Title:`` as Markdown: a heading of that title, the
    note as a sentence under it, then the rest."""
    first, _, rest = textwrap.dedent(epilog).strip("\n").partition("\n")
    m = re.fullmatch(r"([A-Z][\w ]*?)(?: \((.+)\))?:", first.strip())
    if m is None:
        return _blocks(epilog)
    note = f"{_inline(m.group(2)[:1].upper() + m.group(2)[1:])}.\n\n" if m.group(2) else ""
    return f"## {m.group(1)}\n\n{note}{_blocks(rest)}"


def index_page(rows: list[tuple[Command, str]]) -> str:
    """``reference/commands/index.md``: every command, what it does, its page."""
    lines = [
        "# Commands",
        "",
        "<!-- generated by docs/reference_cli.py: do not edit; run python docs/generate.py -->",
        "",
        "Every option of every command, generated from the command's own argument parser, so these pages list "
        "exactly what the command accepts. Each command prints the same with `--help`. Run them from the "
        "repository's root.",
        "",
    ]
    for section in SECTIONS:
        mine = [(c, s) for c, s in rows if c.section == section]
        if not mine:
            continue
        lines += [f"## {section}", "", "| Command | What it does |", "|---|---|"]
        lines += [f"| [{_code('python ' + c.script)}]({c.name}.md) | {_inline(s)} |" for c, s in mine]
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def pages() -> dict[str, str]:
    """``reference/commands/index.md`` and one page per command with a ``build_parser()``."""
    out: dict[str, str] = {}
    rows = []
    for command in COMMANDS:
        parser = parser_of(command)
        if parser is None:
            continue
        out[f"{FOLDER}/{command.name}.md"] = command_page(command, parser)
        rows.append((command, command.summary or _summary(_relative(parser.description or ""))))
    out[f"{FOLDER}/index.md"] = index_page(rows)
    return out
