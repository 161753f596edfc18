"""notebooks/quickstart.ipynb: committed clean, and it runs top to bottom (so it cannot rot).

The run executes the notebook with nbclient in a kernel on this interpreter (a kernelspec
written into ``tmp_path`` and put first on ``JUPYTER_PATH``, so a user-level ``python3`` kernel
pointing at another Python cannot be picked), with the demo data, the index cache and the logs
all under pytest's temporary folders and a short training run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "quickstart.ipynb"
MAX_STEPS = 20  # > the notebook's warm-up of 5 steps, so the profiler has a summary


def _code_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [cell for cell in nb.cells if cell.cell_type == "code"]


def test_committed_notebook_is_clean():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    assert nb.metadata["kernelspec"]["language"] == "python"
    for cell in _code_cells(nb):
        assert cell.outputs == [], f"committed with outputs: {cell.source[:60]!r}"
        assert cell.execution_count is None, f"committed with an execution count: {cell.source[:60]!r}"
    # The config cell comes first and uses the demo data by default.
    config = _code_cells(nb)[0].source
    assert "COCO_ROOT = None  # set to your COCO folder to use real data" in config
    for name in ("TRAIN_ANN", "TRAIN_IMAGES", "VAL_ANN", "VAL_IMAGES", "SEG_DEMO_DIR", "QUICKSTART_MAX_STEPS",
                 "QUICKSTART_NUM_WORKERS"):
        assert name in config


def _outputs(nb: nbformat.NotebookNode, output_type: str) -> list[nbformat.NotebookNode]:
    return [out for cell in _code_cells(nb) for out in cell.outputs if out.output_type == output_type]


@pytest.mark.slow
def test_quickstart_notebook_runs(demo_dir, tmp_path, monkeypatch):
    from ipykernel.kernelspec import write_kernel_spec
    from nbclient import NotebookClient

    # 1. A python3 kernelspec on this interpreter, ahead of any other on the search path.
    write_kernel_spec(tmp_path / "jupyter" / "kernels" / "python3")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    # 2. The kernel inherits this environment: data, caches and a short run in tmp.
    monkeypatch.setenv("SEG_DEMO_DIR", str(demo_dir))
    monkeypatch.setenv("SEG_DATAMODULE_CACHE", str(tmp_path / "cache"))  # the index cache
    monkeypatch.setenv("QUICKSTART_MAX_STEPS", str(MAX_STEPS))
    monkeypatch.setenv("QUICKSTART_NUM_WORKERS", "1")
    monkeypatch.setenv("QUICKSTART_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.delenv("MPLBACKEND", raising=False)  # e.g. Agg in CI would draw nothing inline

    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("import sys; print('kernel prefix:', sys.prefix)"))
    client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError on the first failing cell

    # 3. It ran without error, on this interpreter.
    assert not _outputs(nb, "error")
    stdout = "".join(out.text for out in _outputs(nb, "stream") if out.name == "stdout")
    assert f"kernel prefix: {sys.prefix}" in stdout
    assert f"trained {MAX_STEPS} steps" in stdout
    # 4. The notebook's own table of the profiler's summary, one line per phase.
    table = {line.split()[0] for line in stdout.splitlines() if line.strip()}
    for phase in ("train_dataloader_next", "batch_to_device", "forward", "backward", "optimizer_step", "step"):
        assert phase in table, f"{phase} missing from the notebook's table:\n{stdout}"
    assert "waiting for data:" in stdout
    # 5. At least the batch drawing and the profiler's plot, as PNGs.
    images = [out for out in _outputs(nb, "display_data") + _outputs(nb, "execute_result")
              if "image/png" in out.get("data", {})]
    assert len(images) >= 2
    # 6. The CSV logger and the profiler wrote into the runs folder given.
    version = tmp_path / "runs" / "quickstart" / "version_0"
    for name in ("metrics.csv", "step_time.json", "step_time.png"):
        assert (version / name).is_file(), f"{name} missing in {version}"
    assert list((tmp_path / "cache" / "coco_index").glob("*.npz")), "the index cache went elsewhere"
