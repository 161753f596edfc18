"""Pixel steps: YOLO's HSV jitter and its kernels (``hsv``), the user's albumentations pipeline (``albu``)."""
