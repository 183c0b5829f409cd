#!/usr/bin/env python3
"""Compares (or, with --write, refreshes) the lab's figures against what the lab printed and wrote.

Called by scripts/check_figures.sh, which builds and runs the examples; see there for usage.

    figures.py [--write] RUN_DIR

RUN_DIR holds, for each example NAME of EXAMPLES, NAME.txt (its standard output) and svg/ (where it wrote
its plots, `--out RUN_DIR/svg`).

The tables. An example prints numbered sections ("1. A morning rush ...", "2. ..."), each followed by
markdown tables (runs of lines starting with `|`). A section's table is called EXAMPLE:N (`overload:1`),
its k-th table from the second on EXAMPLE:N.k. A markdown file quotes one between two marker lines:

    <!-- figures:overload:1 -->

    | scenario | gate | ... |
    |---|---|...|
    | rush 2x | no gate | ... |

    <!-- /figures -->

Between the markers there must be the table as printed, line for line (blank lines before and after it are
ignored); --write rewrites what lies between them. QUOTED says which tables which file must quote.

The plots. Every SVG an example writes must equal, byte for byte, the file of the same name in docs/; a
docs/ file named like one of the lab's plots (LAB_SVG) that no example writes is reported too.

Exit status: 0 when everything matches (or was rewritten), 1 when something differs or a marker is missing,
2 when the run's output cannot be read.
"""

import difflib
import filecmp
import os
import re
import shutil
import sys
from pathlib import Path

EXAMPLES = ("overload", "policies")

# Which tables each markdown file quotes. A table printed by an example but not listed here is not checked;
# a listed table without its markers is an error (the message says where the markers go).
QUOTED = {
    "README.md": ["overload:1", "overload:2", "overload:3", "overload:4"],
    "POLICIES.md": ["policies:1", "policies:2", "policies:3", "policies:4", "policies:5", "policies:6"],
}

# docs/ files the lab owns: a match that no example writes is a stale figure.
LAB_SVG = re.compile(r"^(overload|policy)-.*\.svg$")

OPEN = re.compile(r"^<!--\s*figures:(\S+)\s*-->$")
CLOSE = re.compile(r"^<!--\s*/figures\s*-->$")
SECTION = re.compile(r"^(\d+)\.\s")


class Unreadable(Exception):
    """The run's output or a markdown file cannot be parsed."""


def tables(example, text):
    """The tables an example printed, by name, each a list of lines (without newlines)."""
    found = {}
    section = None
    count = 0
    current = None
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            if current is None:
                if section is None:
                    raise Unreadable(f"{example}: a table before the first numbered section")
                count += 1
                name = f"{example}:{section}" + ("" if count == 1 else f".{count}")
                current = found[name] = []
            current.append(line)
            continue
        current = None
        match = SECTION.match(line)
        if match:
            section, count = match.group(1), 0
    return found


def blocks(path, lines):
    """The marked blocks of a markdown file: name -> (first content line, end line) as 0-based indices."""
    found = {}
    name = start = None
    for i, line in enumerate(lines):
        opened, closed = OPEN.match(line.strip()), CLOSE.match(line.strip())
        if opened:
            if name is not None:
                raise Unreadable(f"{path}:{i + 1}: figures:{opened.group(1)} opened inside figures:{name}")
            name, start = opened.group(1), i + 1
        elif closed:
            if name is None:
                raise Unreadable(f"{path}:{i + 1}: <!-- /figures --> without an opening marker")
            found.setdefault(name, []).append((start, i))
            name = None
    if name is not None:
        raise Unreadable(f"{path}:{start}: figures:{name} is never closed by <!-- /figures -->")
    return found


def trimmed(lines):
    """The lines without leading and trailing blank lines."""
    first, last = 0, len(lines)
    while first < last and not lines[first].strip():
        first += 1
    while last > first and not lines[last - 1].strip():
        last -= 1
    return lines[first:last]


def diff(old, new, old_name, new_name, limit=40):
    """A unified diff, at most `limit` lines, each cut at 200 characters."""
    out = list(difflib.unified_diff(old, new, old_name, new_name, n=1, lineterm=""))
    cut = [line if len(line) <= 200 else line[:200] + " [...]" for line in out[:limit]]
    if len(out) > limit:
        cut.append(f"[... {len(out) - limit} more diff lines]")
    return "\n".join("    " + line for line in cut)


def check_markdown(path, printed, write, problems, notes):
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    marked = blocks(path, lines)
    for name in marked:
        if name not in printed:
            problems.append(
                f"{path}: marker figures:{name} names no table the examples print "
                f"(they print {', '.join(sorted(printed))})"
            )
    for name in QUOTED.get(path.name, []):
        if name not in printed:
            problems.append(f"{path}: {name} is listed in QUOTED ({Path(__file__).name}) but no example prints it")
            continue
        table = printed[name]
        if name not in marked:
            missing = [row for row in table if row not in lines]
            where = (
                "its rows all appear verbatim in the file"
                if not missing
                else f"{len(missing)} of its {len(table)} lines do not appear verbatim in the file, e.g.\n      "
                + "\n      ".join(missing[:3])
            )
            # Where the table probably is: the first line of the file equal to one of its rows, else to its header.
            at = next((i + 1 for i, line in enumerate(lines) if line in table[2:]), None) or next(
                (i + 1 for i, line in enumerate(lines) if line == table[0]), None
            )
            problems.append(
                f"{path}{f':{at}' if at else ''}: no markers around {name} (first row `{table[2][:70]}...`); "
                f"{where}.\n    Put `<!-- figures:{name} -->` on its own line before the table and "
                f"`<!-- /figures -->` on its own line after it, then run scripts/check_figures.sh --write."
            )
    replacements = []
    for name, spans in marked.items():
        if name not in printed:
            continue
        for start, end in spans:
            quoted = trimmed(lines[start:end])
            if quoted == printed[name]:
                continue
            if write:
                replacements.append((start, end, [""] + printed[name] + [""]))
                notes.append(f"rewrote {name} in {path} (line {start})")
            else:
                problems.append(
                    f"{path}:{start}: {name} differs from what the example prints:\n"
                    + diff(quoted, printed[name], f"{path.name} (committed)", f"{name} (printed)")
                )
    if replacements:
        for start, end, new in sorted(replacements, reverse=True):
            lines[start:end] = new
        path.write_text("\n".join(lines), encoding="utf-8")


def check_svgs(written, docs, write, problems, notes):
    names = set()
    for svg in sorted(written.glob("*.svg")):
        names.add(svg.name)
        committed = docs / svg.name
        if committed.exists() and filecmp.cmp(svg, committed, shallow=False):
            continue
        if write:
            shutil.copyfile(svg, committed)
            notes.append(f"{'updated' if committed.exists() else 'created'} {committed}")
        elif not committed.exists():
            problems.append(f"{committed}: the lab writes it but it is not in the tree")
        else:
            old = committed.read_text(encoding="utf-8", errors="replace").splitlines()
            new = svg.read_text(encoding="utf-8", errors="replace").splitlines()
            problems.append(
                f"{committed}: differs from what the lab writes ({committed.stat().st_size} vs "
                f"{svg.stat().st_size} bytes):\n" + diff(old, new, f"{committed} (committed)", f"{svg.name} (written)", 12)
            )
    if not names:
        raise Unreadable(f"{written}: the examples wrote no SVG")
    for stale in sorted(docs.glob("*.svg")):
        if LAB_SVG.match(stale.name) and stale.name not in names:
            problems.append(
                f"{stale}: named like a lab plot, but no example writes it (remove it, or make an example write it)"
            )
    return len(names)


def main(argv):
    write = "--write" in argv
    rest = [a for a in argv if a != "--write"]
    if len(rest) != 1:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    run = Path(rest[0]).resolve()
    root = Path(__file__).resolve().parent.parent
    problems, notes = [], []
    try:
        printed = {}
        for example in EXAMPLES:
            printed.update(tables(example, (run / f"{example}.txt").read_text(encoding="utf-8")))
        os.chdir(root)  # paths in messages relative to the repository
        for name in QUOTED:
            check_markdown(Path(name), printed, write, problems, notes)
        svgs = check_svgs(run / "svg", Path("docs"), write, problems, notes)
    except (Unreadable, OSError) as e:
        print(f"figures: {e}", file=sys.stderr)
        return 2
    for note in notes:
        print(note)
    quoted = sum(len(v) for v in QUOTED.values())
    if problems:
        count = f"{len(problems)} problem{'s' if len(problems) > 1 else ''}"
        print(f"\nthe lab's figures differ from what it produces today ({count}):\n", file=sys.stderr)
        for problem in problems:
            print(f"- {problem}\n", file=sys.stderr)
        if not write:
            print("scripts/check_figures.sh --write refreshes every SVG and every marked table.", file=sys.stderr)
        return 1
    verb = "refreshed" if write else "match"
    print(f"figures {verb}: {svgs} SVGs in docs/, {quoted} tables in {', '.join(QUOTED)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
