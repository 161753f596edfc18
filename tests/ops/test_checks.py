"""The same argument mistake reads the same at every public entry point."""

from __future__ import annotations

import pytest

from seg_datamodule import COCOSegDataModule, DetectionCollate, rasterize_polygons
from seg_datamodule.io.coco.errors import SKIP_REASONS
from seg_datamodule.io.images.decode import IMAGE_ERROR_REASONS
from seg_datamodule.ops.checks import check_canvas_size, check_choice, check_int


@pytest.mark.parametrize("bad, error, message", [
    ("4", TypeError, "mask_stride must be an int >= 1, got '4'"),
    (4.0, TypeError, "mask_stride must be an int >= 1, got 4.0"),
    (True, TypeError, "mask_stride must be an int >= 1, got True"),
    (0, ValueError, "mask_stride must be >= 1, got 0"),
])
def test_mask_stride_mistake_is_the_same_everywhere(bad, error, message) -> None:
    for make in (lambda: COCOSegDataModule(mask_stride=bad), lambda: DetectionCollate(mask_stride=bad)):
        with pytest.raises(error) as info:
            make()
        assert str(info.value) == message
    with pytest.raises(error) as info:
        rasterize_polygons([], (8, 8), stride=bad)
    assert str(info.value) == message.replace("mask_stride", "stride")


def test_checks_name_argument_expected_and_got() -> None:
    with pytest.raises(ValueError, match=r"on_bad_sample must be one of \['raise', 'skip'\], got 'x'"):
        check_choice("on_bad_sample", "x", ("raise", "skip"))
    with pytest.raises(TypeError, match=r"on_bad_sample must be one of \['raise', 'skip'\], got 1"):
        check_choice("on_bad_sample", 1, ("raise", "skip"))
    with pytest.raises(ValueError, match="n must be <= 3, got 4"):
        check_int("n", 4, 0, maximum=3)
    with pytest.raises(TypeError, match=r"canvas_size must be \(H, W\)"):
        check_canvas_size("canvas_size", 5)
    with pytest.raises(ValueError, match=r"canvas_size\[1\] must be >= 0, got -1"):
        check_canvas_size("canvas_size", (2, -1))


def test_every_image_error_reason_is_a_skip_reason() -> None:
    # Was an import-time assert in the COCO module (gone under python -O).
    assert set(IMAGE_ERROR_REASONS) <= set(SKIP_REASONS)
