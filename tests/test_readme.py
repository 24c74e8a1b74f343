"""The README starts with the two set-up commands, each in its own code block, so that pasting the first one
runs the app and nothing else (issue 29: pasting a block holding both ran the tests after the server stopped)."""
from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks(text: str) -> list[tuple[int, str]]:
    """(start offset, body) of each fenced code block."""
    return [(m.start(), m.group(1)) for m in re.finditer(r"^```[a-z]*\n(.*?)^```$", text, re.M | re.S)]


def test_readme_starts_with_the_two_setup_commands_in_their_own_blocks():
    text = README.read_text(encoding="utf-8")
    blocks = _blocks(text)
    assert len(blocks) >= 2
    (first_at, first), (second_at, second) = blocks[:2]
    # nothing but the title before them, nothing but blank lines between them
    assert [line for line in text[:first_at].splitlines() if line.strip()] == ["# forgetlab"]
    between = text[first_at:second_at].split("```", 2)[-1]
    assert between.strip("`\n ") == "", f"text between the two set-up blocks: {between!r}"
    commands = [[line for line in b.splitlines() if line.strip() and not line.lstrip().startswith("#")]
                for b in (first, second)]
    assert [len(c) for c in commands] == [1, 1], commands
    assert "streamlit run app.py" in commands[0][0] and "run-tests" not in commands[0][0]
    assert commands[1][0] == "bash tools/run-tests"


def test_readme_lists_the_tested_architectures():
    """The README's "Bring your own model" table is forgetlab.core.layouts.FAMILIES, family by family, so that
    the families the error messages name and the ones the README promises are the same."""
    from forgetlab.core.layouts import FAMILIES

    text = README.read_text(encoding="utf-8")
    start = text.index("### Bring your own model")
    section = text[start:text.index("\n#", start + 1)]
    rows = re.findall(r"^\| ([^|`]+?) \| (`.+?`) \|$", section, re.M)
    table = {name: tuple(re.findall(r"`([^`]+)`", types)) for name, types in rows if name != "Family"}
    assert table == FAMILIES
    assert "docs/methods.md#architectures" in section
