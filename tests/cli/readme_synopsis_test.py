#!/usr/bin/env python3
"""Every long flag that `ferry ... --help` lists appears in the README's CLI
synopsis, in the entry of its subcommand, so the two cannot drift apart.

Usage: readme_synopsis_test.py FERRY_BINARY README.md
Walks `--help` of the program and of every subcommand it lists (nested ones
too), takes the long flags of each "Options:" section, and looks for each in the
synopsis block under "## The CLI": the entry that starts `ferry WORD` for a
flag of `ferry WORD ...`, the `ferry --help` line for the program's own. Then it
drops one flag of each entry from a copy of the synopsis and checks that the
same search reports it missing (a check that cannot fail checks nothing).
Exit 0: every flag found and every dropped flag reported; 1 otherwise.
"""
import re
import subprocess
import sys

OPTION = re.compile(r"^  (?:-\w,)?--([a-z0-9][a-z0-9-]*)")
SUBCOMMAND = re.compile(r"^  ([a-z][a-z0-9-]*)\s")


def help_sections(binary, words):
    """{section title: [lines]} of `ferry WORDS --help`."""
    out = subprocess.run([binary, *words, "--help"], capture_output=True, text=True, check=True).stdout
    sections, title = {}, None
    for line in out.splitlines():
        if line and not line.startswith(" "):
            title = line.rstrip(":") if line.endswith(":") else None
            continue
        if title:
            sections.setdefault(title, []).append(line)
    return sections


def flags_by_command(binary, words=()):
    """{(word, ...): {long flag, ...}} for the program and every subcommand below it."""
    sections = help_sections(binary, list(words))
    names = {"--" + m.group(1) for line in sections.get("Options", []) if (m := OPTION.match(line))}
    if words:
        names.discard("--help")  # every subcommand's: the synopsis's `ferry SUBCOMMAND --help`
    found = {tuple(words): names}
    for line in sections.get("Subcommands", []):
        m = SUBCOMMAND.match(line)
        if m:
            found.update(flags_by_command(binary, (*words, m.group(1))))
    return found


def synopsis(readme_text):
    """{first word after `ferry` ("" for the program's own line): entry text}."""
    lines = readme_text.splitlines()
    start = lines.index("## The CLI") + 1
    entries, key = {}, None
    for line in lines[start:]:
        if line.startswith("#"):
            break
        if line and not line.startswith("    "):
            if entries:
                break  # the paragraph after the block
            continue
        m = re.match(r"^    ferry (\S+)", line)
        if m:
            key = "" if m.group(1).startswith("-") else m.group(1)
        if key is not None:
            entries[key] = entries.get(key, "") + line + "\n"
    return entries


def missing(flags, entries):
    """[(command, flag)] of the flags no entry of their command names."""
    gone = []
    for words, names in sorted(flags.items()):
        text = entries.get(words[0] if words else "", "")
        for flag in sorted(names):
            if not re.search(re.escape(flag) + r"(?![a-z0-9-])", text):
                gone.append((" ".join(("ferry",) + words), flag))
    return gone


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    flags = flags_by_command(argv[1])
    with open(argv[2], encoding="utf-8") as f:
        entries = synopsis(f.read())
    bad = 0
    for command, flag in missing(flags, entries):
        print(f"README.md's CLI synopsis lacks {flag} of `{command}` (listed by its --help)")
        bad += 1
    # The plant: drop each entry's first flag and expect the search to report it.
    for key in sorted(entries):
        names = sorted(f for words, fs in flags.items() if (words[0] if words else "") == key for f in fs)
        if not names:
            continue
        planted = dict(entries)
        planted[key] = re.sub(re.escape(names[0]) + r"(?![a-z0-9-])", "", entries[key])
        if not any(flag == names[0] for _, flag in missing(flags, planted)):
            print(f"the check did not report {names[0]} dropped from the entry `ferry {key}`")
            bad += 1
    commands = len(flags)
    total = sum(len(f) for f in flags.values())
    if not bad:
        print(f"README.md's CLI synopsis names all {total} long flags of {commands} commands' --help;"
              f" a dropped flag is reported in each of its {len(entries)} entries")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
