"""The inspect report as one static HTML page: sections of text and pictures, written beside their images.

Pure layout: :func:`write_report` takes what :mod:`~seg_datamodule.pictures.inspect` gathered and
writes ``index.html`` with its pictures in ``images/`` (relative links, no script from anywhere
else, no server: it opens from the disk in any browser). A small inline script counts the pictures
the browser decoded into ``<body data-images-loaded>``, what the headless-browser test reads.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from seg_datamodule.pictures.writer import write_picture

__all__ = ["Card", "Report", "write_report"]


@dataclass
class Card:
    """One picture with its caption.

    Attributes:
        title: the caption's first line (a reason, an image).
        detail: what it shows (ids, the file, why).
        picture (ndarray[H, W, 3] uint8 | None): RGB; None: a text card (an image that cannot be read).
    """

    title: str
    detail: str
    picture: np.ndarray | None = None


@dataclass
class Report:
    """What the page shows, in order.

    Attributes:
        title: the page's title (the split and its source).
        facts: lines of numbers (the scan, what the index left out).
        problem: a setup error to show first (setup stops there), or None.
        label_picture (ndarray | None): the split's label statistics.
        samples: pairs of cards, each image as read beside the same image through the recipe.
        gallery: reason -> its cards (annotations dropped or changed, drawn on their images).
        reasons: reason -> what it means.
    """

    title: str
    facts: list[str] = field(default_factory=list)
    problem: str | None = None
    label_picture: np.ndarray | None = None
    samples: list[tuple[Card, Card]] = field(default_factory=list)
    gallery: dict[str, list[Card]] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #ccc; }
pre { background: #f6f6f6; padding: 8px; white-space: pre-wrap; }
.problem { background: #fde8e8; border-left: 4px solid #c00; padding: 8px; }
.row { display: flex; gap: 12px; margin: 8px 0; align-items: flex-start; }
.grid { display: flex; flex-wrap: wrap; gap: 12px; }
figure { margin: 0; max-width: 480px; } figure img { max-width: 480px; display: block; }
figcaption { font-size: 12px; } figcaption b { display: block; }
.text { width: 320px; height: 120px; background: #ddd; display: flex; align-items: center; justify-content: center; }
"""
_COUNT_LOADED = """
window.addEventListener("load", function () {
  var shown = Array.prototype.filter.call(document.images, function (i) { return i.complete && i.naturalWidth > 0; });
  document.body.setAttribute("data-images-loaded", String(shown.length));
});
"""


def _figure(card: Card, images: Path, name: str) -> str:
    if card.picture is None:
        body = '<div class="text">no picture</div>'
    else:
        write_picture(images / name, card.picture)
        body = f'<img src="images/{name}" alt="{html.escape(card.title)}">'
    return (f"<figure>{body}<figcaption><b>{html.escape(card.title)}</b>{html.escape(card.detail)}"
            f"</figcaption></figure>")


def write_report(report: Report, folder: Path) -> Path:
    """Write ``folder/index.html`` and its pictures (``folder/images/``).

    Returns:
        Path: the page.
    """
    images = folder / "images"
    images.mkdir(parents=True, exist_ok=True)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(report.title)}</title>",
             f"<style>{_STYLE}</style><script>{_COUNT_LOADED}</script></head><body>",
             f"<h1>{html.escape(report.title)}</h1>"]
    if report.problem:
        parts.append(f'<p class="problem">setup stops this split: {html.escape(report.problem)}</p>')
    parts.append("<h2>What the split holds</h2><pre>" + html.escape("\n".join(report.facts)) + "</pre>")
    if report.label_picture is not None:
        write_picture(images / "labels.png", report.label_picture)
        parts.append('<img src="images/labels.png" alt="label statistics" style="max-width: 100%">')
    if report.samples:
        parts.append("<h2>Images as read, and through the recipe</h2>")
        for k, (raw, built) in enumerate(report.samples):
            parts.append(f'<div class="row">{_figure(raw, images, f"raw_{k}.jpg")}'
                         f'{_figure(built, images, f"recipe_{k}.jpg")}</div>')
    parts.append("<h2>Annotations dropped or changed, by reason</h2>")
    if not report.gallery:
        parts.append("<p>None found.</p>")
    for reason, cards in report.gallery.items():
        parts.append(f"<h3>{html.escape(reason)} ({len(cards)} shown)</h3>"
                     f"<p>{html.escape(report.reasons.get(reason, ''))}</p><div class='grid'>")
        parts += [_figure(card, images, f"{reason}_{k}.jpg") for k, card in enumerate(cards)]
        parts.append("</div>")
    parts.append("</body></html>")
    page = folder / "index.html"
    page.write_text("\n".join(parts), encoding="utf-8")
    return page
