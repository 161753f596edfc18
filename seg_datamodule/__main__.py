"""``python -m seg_datamodule fit --config configs/demo.yaml``."""

from seg_datamodule.cli import main

if __name__ == "__main__":
    main()
