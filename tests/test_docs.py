"""The documentation site builds with warnings as errors, and the README stays one screen.

``mkdocs build --strict`` fails on a broken link or anchor, a page missing from the navigation, or
a name the API reference (mkdocstrings) cannot find; this runs the build the README and the first
page tell a user to run, into ``tmp_path``. The code blocks of the README and of every page run in
``tests/test_readme.py``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIG = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
#: Material's notice about MkDocs 2 is printed on every build; it is not about these pages.
ENV = dict(os.environ, NO_MKDOCS_2_WARNING="1")


def _build(folder: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(folder / "mkdocs.yml"),
                           "-d", str(out)], cwd=folder, env=ENV, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_site_builds_strictly(tmp_path):
    result = _build(ROOT, tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    # The API reference rendered the objects it names (not an empty page).
    reference = (tmp_path / "site" / "reference" / "datamodule" / "index.html").read_text()
    assert "COCOSegDataModule" in reference and "train_ann" in reference


def _mini_site(folder: Path, index: str, pages: dict[str, str], nav: list[str]) -> Path:
    """A site with this project's checks (strict, validation) and the given pages: no API pages."""
    (folder / "docs").mkdir(parents=True)
    (folder / "docs" / "index.md").write_text(index)
    for name, text in pages.items():
        (folder / "docs" / name).write_text(text)
    config = {key: CONFIG[key] for key in ("site_name", "strict", "validation", "markdown_extensions")}
    (folder / "mkdocs.yml").write_text(yaml.safe_dump({**config, "nav": nav}))
    return folder


@pytest.mark.parametrize("index,pages,nav,expected", [
    ("# A\n[gone](missing.md)\n", {}, ["index.md"], "missing.md"),
    ("# A\n[b](b.md#no-such-heading)\n", {"b.md": "# B\n"}, ["index.md", "b.md"], "no-such-heading"),
    ("# A\n", {"orphan.md": "# O\n"}, ["index.md"], "orphan.md"),
], ids=["broken-link", "broken-anchor", "page-not-in-nav"])
def test_the_build_fails_on_what_rots(tmp_path, index, pages, nav, expected):
    folder = _mini_site(tmp_path / "site-src", index, pages, nav)
    result = _build(folder, tmp_path / "out")
    assert result.returncode != 0 and expected in result.stdout + result.stderr, result.stdout + result.stderr
    # The same site without the defect builds: the failure was the defect's.
    fixed = _mini_site(tmp_path / "fixed", "# A\n", {}, ["index.md"])
    assert _build(fixed, tmp_path / "out2").returncode == 0


def test_every_page_is_in_the_nav_and_exists():
    def walk(node):
        if isinstance(node, str):
            return [node]
        items = node.values() if isinstance(node, dict) else node
        return [p for item in items for p in walk(item)]

    nav = walk(CONFIG["nav"])
    pages = sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(nav) == pages


def test_readme_is_one_screen_or_two():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 200, len(lines)


def test_readme_yaml_is_the_shipped_config():
    """The README's YAML is ``configs/coco.yaml``'s ``data`` section, key for key (a subset)."""
    blocks = re.findall(r"^```yaml\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M)
    assert len(blocks) == 1
    shown = yaml.safe_load(blocks[0])["data"]
    shipped = yaml.safe_load((ROOT / "configs" / "coco.yaml").read_text())["data"]
    assert shown == {key: shipped[key] for key in shown}


def test_readme_links_resolve():
    """The README is read on its own (GitHub, PyPI): every relative link names a file of the repository."""
    text = (ROOT / "README.md").read_text()
    links = [link.split("#")[0] for link in re.findall(r"\]\(([^)]+)\)", text) if "://" not in link]
    assert links and all((ROOT / link).is_file() for link in links), [l for l in links if not (ROOT / l).is_file()]
