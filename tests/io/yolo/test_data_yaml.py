"""data.yaml: classes and split paths as Ultralytics reads them, nothing in it run, mistakes named by file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from seg_datamodule.io.yolo import DatasetNotFoundError, DatasetYamlError, read_dataset_yaml


def _yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "data.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("names, expected", [
    ("[cat, dog]", ("cat", "dog")),
    ("{0: cat, 1: dog}", ("cat", "dog")),
    ("{'1': dog, '0': cat}", ("cat", "dog")),
    ("[1, true]", ("1", "True")),  # str-ified, as Ultralytics' check_class_names does
])
def test_names_as_a_list_or_a_dict(tmp_path: Path, names: str, expected: tuple[str, ...]) -> None:
    assert read_dataset_yaml(_yaml(tmp_path, f"train: .\nnames: {names}\n")).class_names == expected


def test_nc_alone_and_nc_that_agrees(tmp_path: Path) -> None:
    assert read_dataset_yaml(_yaml(tmp_path, "nc: 3\n")).class_names == ("class_0", "class_1", "class_2")
    assert read_dataset_yaml(_yaml(tmp_path, "nc: '2'\nnames: [a, b]\n")).class_names == ("a", "b")


@pytest.mark.parametrize("text, match", [
    ("nc: 3\nnames: [a, b]\n", "names has 2 classes but nc is 3"),
    ("names: {0: a, 2: b}\n", r"indices must be 0..1, got \[0, 2\]"),
    ("names: {x: a}\n", "key 'x' is not a class index"),
    ("names: a\n", "names must be a list or a dict"),
    ("names: []\n", "names is empty"),
    ("train: x\n", "needs names"),
    ("nc: 1.5\n", "nc must be a positive integer"),
    ("- a\n- b\n", "a data.yaml is a mapping"),
    ("names: [a\n", "not a YAML file"),
    ("train: {a: 1}\nnames: [a]\n", "train must be a folder or .txt list"),
    ("path: [1]\nnames: [a]\n", "path must be a folder"),
])
def test_mistakes_name_the_file_and_the_key(tmp_path: Path, text: str, match: str) -> None:
    path = _yaml(tmp_path, text)
    with pytest.raises(DatasetYamlError, match=match) as info:
        read_dataset_yaml(path)
    assert str(info.value).startswith(str(path)) and isinstance(info.value, ValueError)


def test_a_python_tag_is_refused_not_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = _yaml(tmp_path, f"names: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(DatasetYamlError, match="not a YAML file"):
        read_dataset_yaml(path)
    assert not marker.exists()


def test_paths_resolve_as_ultralytics_resolves_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "ds"
    for folder in ("images/train", "images/val", "extra"):
        (root / folder).mkdir(parents=True)
    (root / "val.txt").write_text("./images/val/a.jpg\n")
    # No path: the YAML's folder.
    data = read_dataset_yaml(_yaml(root, "train: images/train\nval: [val.txt, extra]\nnames: [a]\n"))
    assert data.root == root and data.sources("train") == (root / "images/train",)
    assert data.sources("val") == (root / "val.txt", root / "extra")
    # `validation` is `val`; a missing path starting with ../ is retried without it.
    data = read_dataset_yaml(_yaml(root, "validation: ../images/val\nnames: [a]\n"))
    assert data.splits == ["val"] and data.sources("val") == ((root / "images/val").resolve(),)
    # A relative path: to the working directory when it exists there (Ultralytics), else to the YAML's folder.
    other = tmp_path / "elsewhere" / "ds"
    (other / "images/train").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "elsewhere")
    data = read_dataset_yaml(_yaml(root, "path: ds\ntrain: images/train\nnames: [a]\n"))
    assert data.sources("train") == ((other / "images/train").resolve(),)
    data = read_dataset_yaml(_yaml(root, "path: .\nval: images/val\nnames: [a]\n"))  # CVAT's `path: .`
    assert data.sources("val") == ((root / "images/val").resolve(),)
    monkeypatch.chdir(tmp_path)
    data = read_dataset_yaml(_yaml(root, f"path: {root}\ntrain: images/train\nnames: [a]\n"))
    assert data.sources("train") == ((root / "images/train").resolve(),)


def test_an_unknown_or_empty_split_is_named(tmp_path: Path) -> None:
    data = read_dataset_yaml(_yaml(tmp_path, "train: .\nval: ''\ntest:\nnames: [a]\n"))
    assert data.splits == ["train"]
    with pytest.raises(DatasetYamlError, match=r"no split 'test' \(splits: train\)"):
        data.sources("test")
    with pytest.raises(DatasetNotFoundError, match="does not exist"):
        read_dataset_yaml(tmp_path / "nope.yaml")


@pytest.mark.parametrize("script", ["python", "bash"])
def test_a_download_script_is_never_run(tmp_path: Path, script: str) -> None:
    """Ultralytics runs ``download:`` with exec (or a shell) when a split is missing; here it is never read."""
    marker = tmp_path / "downloaded"
    download = (f"download: |\n  open({str(marker)!r}, 'w').write('x')\n" if script == "python"
                else f"download: bash -c 'touch {marker}'\n")
    data = read_dataset_yaml(_yaml(tmp_path, f"train: images/train\nnames: [a]\n{download}"))
    with pytest.raises(DatasetNotFoundError, match=r"images/train does not exist .*download: script"):
        data.sources("train")
    assert not marker.exists()
    assert "download" not in data.splits
