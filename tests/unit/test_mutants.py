"""Every committed mutant (`mutants/*.toml`, run by `make mutants`) is well formed and still
applies to the code: its `find` occurs exactly once in its file and its tests exist. A refactor
that moves a guarantee's code makes this say which mutant went stale."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.mutants import FOLDER, ROOT, MutantFileError, load, problems

FILES = sorted((ROOT / FOLDER).glob("*.toml"))


def test_there_are_committed_mutants():
    assert FILES, f"no mutant files in {ROOT / FOLDER}"


@pytest.mark.parametrize("path", FILES, ids=[path.stem for path in FILES])
def test_each_mutant_is_well_formed_and_still_applies(path: Path):
    mutant = load(path)

    assert problems(mutant) == []
    assert all(test.startswith("tests/") for test in mutant.tests), mutant.tests


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("guarantee = ", "not a readable TOML file"),
        ('guarantee = "g"\nfile = "a.py"\nfind = "x"\nreplace = "y"\n', "tests: Field required"),
        (
            'guarantee = "g"\nfile = "../a.py"\nfind = "x"\nreplace = "y"\ntests = ["t.py"]\n',
            "file: Value error, must be a path inside the repository",
        ),
        (
            'guarantee = "g"\nfile = "a.py"\nfind = "x"\nreplace = "x"\ntests = ["t.py"]\n',
            "replace is the same text as find",
        ),
        (
            'guarantee = "g"\nfile = "a.py"\nfind = "x"\nreplace = "y"\ntests = []\n'
            'severity = "high"\n',
            "tests: List should have at least 1 item",
        ),
        (
            'guarantee = """two\nlines"""\nfile = "a.py"\nfind = "x"\nreplace = "y"\n'
            'tests = ["t.py"]\n',
            "guarantee: Value error, must be one line",
        ),
    ],
)
def test_a_bad_mutant_file_is_refused_in_one_line_naming_it(tmp_path: Path, text, message):
    path = tmp_path / "bad-one.toml"
    path.write_text(text, encoding="utf-8")

    with pytest.raises(MutantFileError) as refused:
        load(path)

    assert str(refused.value).startswith(f"{path}: ")
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)
