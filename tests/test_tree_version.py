"""The SGLang version of a tree (issue 41 item 6): read from code with ``ast`` (the assignment
Python runs, never a comment or a string that mentions ``__version__``), and version files that
disagree are exit 2 naming both files and both versions (dsv4ctl/patches/tree.py)."""

from __future__ import annotations

import pytest

from dsv4ctl.patches.tree import version_assigned
from tests.conftest import run_cli
from tests.sshd.world import git
from tests.test_versions_cli import prof  # noqa: F401  (the fixture)

COMMENTED = ("# before 0.5.21 we had: __version__ = '0.5.20'\n"
             "NOTE = \"__version__ = '0.5.19' in the old layout\"\n"
             "__version__ = version = '0.5.23'\n")


@pytest.mark.parametrize("source, want", [
    (COMMENTED, "0.5.23"),
    ("version: str\n__version__: str\n__version__ = version = '0.5.22'\n", "0.5.22"),   # setuptools-scm's file
    ("__version__: str = '0.5.21'\n", "0.5.21"),
    ("__version__ = '0.5.18'\n__version__ = '0.5.19'\n", "0.5.19"),                     # the last one runs
    ("try:\n    from sglang._version import __version__\nexcept ImportError:\n    __version__ = '0.0.0.dev0'\n", None),
    ("try:\n    from x import v\nexcept ImportError:\n    __version__ = '0.5.20'\n", "0.5.20"),
    ("if A:\n    __version__ = '0.5.20'\nelse:\n    __version__ = '0.5.21'\n", None),         # which one: unknowable
    ("def f():\n    __version__ = '0.5.20'\n", None),
    ("# __version__ = '0.5.20'\n", None),
    ("__version__ = get_version()\n", None),
])
def test_version_is_the_assignment_not_a_mention(source, want):
    assert version_assigned(source) == want


def _tree(tmp_path, files: dict[str, str], tag: str = "v0.5.23"):
    t = tmp_path / "sglang"
    for rel, text in files.items():
        (t / rel).parent.mkdir(parents=True, exist_ok=True)
        (t / rel).write_text(text)
    git(t, "init", "-q")
    git(t, "add", "-A")
    git(t, "commit", "-q", "-m", "x")
    git(t, "tag", tag)
    return t


def test_a_commented_old_version_is_not_the_trees_version(tmp_path):
    """The regex read '0.5.20' from the comment: status looked for base v0.5.20 (exit 2)."""
    t = _tree(tmp_path, {"python/sglang/_version.py": COMMENTED})
    r = run_cli("patch", "status", str(t), "--json")
    assert r.code == 0, r.err
    assert (r.json()["version"], r.json()["base_ref"]) == ("0.5.23", "v0.5.23")


def test_version_files_that_disagree_are_exit_2_naming_both(tmp_path, prof):  # noqa: F811
    """_version.py 0.5.23, pyproject.toml 0.5.22: planned with 0.5.23 and no word before."""
    t = _tree(tmp_path, {"python/sglang/_version.py": "__version__ = version = '0.5.23'\n",
                         "python/pyproject.toml": '[project]\nname = "sglang"\nversion = "0.5.22"\n'})
    want = (f"dsv4ctl: error: {t}: python/sglang/_version.py at HEAD says SGLang '0.5.23' but "
            "python/pyproject.toml says '0.5.22': make the tree's version files agree")
    for args in (["patch", "status", str(t)], ["plan", str(prof(version="0.5.23", tree=t))]):
        r = run_cli(*args)
        assert r.code == 2, (args, r.out, r.err)
        assert r.err.strip() == want, args


def test_a_version_file_that_is_no_python_is_exit_2(tmp_path):
    t = _tree(tmp_path, {"python/sglang/_version.py": "__version__ = '0.5.23\n"})
    r = run_cli("patch", "status", str(t))
    assert r.code == 2 and "Traceback" not in r.err
    assert r.err.strip() == (f"dsv4ctl: error: {t}: python/sglang/_version.py at HEAD is not Python "
                             "(SyntaxError line 1): cannot read the SGLang version")
