"""What the step-time report says to do: :func:`judge_step_time`, rules over the report's figures.

Pure and Lightning-free: it reads the summary (:meth:`~seg_datamodule.profiling.accumulator.StepTimeAccumulator.compute`, plus the
isolated optimiser timing), the wall-time account and what the callback saw of the loader, all
of them in ``step_time.json``, so a finished run's verdict can be recomputed from its file.

The rules, each a finding with the figures it rests on (the thresholds are :data:`THRESHOLDS`):

* ``loader_bound``: ``train_dataloader_next`` is at least 20 % of the step time. The loop then
  runs at the loader's pace: the loader *delivers* one batch per mean step, the step would
  *consume* one per mean step less its wait. With ``W > 0`` workers each delivers
  ``delivery / W`` (all are busy, or the step would not wait); with 0 workers the training
  thread builds a batch in the mean fetch time, which is one worker's rate. Workers needed:
  ``ceil(consumption / per-worker rate)``, capped by the cores (one is the training process's).
* ``optimizer_starved``: the optimiser step in the loop (median over the steps that stepped) is
  at least 1.5 x its cost alone (``isolated_optimizer_steps``; only when that ran).
* ``transfer_bound``: ``batch_to_device`` is at least 10 % of the step time. Pinned memory and
  ``non_blocking`` copies are advised only when the batches go to a CUDA device: on a CPU run
  nothing is copied to a device (its ``batch_to_device`` is the transfer hooks' own work).
* ``device_work``: ``device_work`` (``on_after_batch_transfer``: work on the batch once it is on
  its device, the DataModule's ``hsv_on_device`` jitter) is at least 10 % of the step time. On a
  CPU run that is the training process doing what the loader's workers could do in parallel.
* ``between_steps``: at least 30 % of training wall time passed between steps (validation,
  checkpointing, logging, epoch starts).
* ``compute_bound``: none of the above.

When several fire, the one that accounts for the largest share of training wall time is the
verdict, the others follow in ``also`` (largest first): a loader that costs 20 % of steps that
are 40 % of the wall matters less than validation taking the other 60 %.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["THRESHOLDS", "judge_step_time"]

#: Where each rule fires (documented in docs/guides/profiler.md).
THRESHOLDS: dict[str, float] = {
    "loader_share": 0.20,  # train_dataloader_next share of the step
    "optimizer_ratio": 1.5,  # in-loop over isolated optimiser step
    "transfer_share": 0.10,  # batch_to_device share of the step
    "device_work_share": 0.10,  # device_work (on_after_batch_transfer) share of the step
    "between_steps_share": 0.30,  # time between steps, share of training wall time
}


def _rate(per_batch_ms: float) -> float:
    return 1e3 / per_batch_ms if per_batch_ms > 0 else math.inf


def _images(batches_s: float, batch_size: int | None) -> str:
    """A rate for a sentence: img/s when the batch size is known, else batches/s."""
    if batch_size:
        return f"{batches_s * batch_size:.1f} img/s"
    return f"{batches_s:.2f} batches/s"


def _workers(count: int) -> str:
    return f"{count} worker" if count == 1 else f"{count} workers"


def _loader_finding(summary: Mapping[str, Mapping[str, float]], loader: Mapping[str, Any]) -> dict[str, Any]:
    fetch, step = summary["train_dataloader_next"], summary["step"]
    workers, batch_size, cores = loader.get("num_workers"), loader.get("batch_size"), loader.get("cores")
    compute_ms = max(step["mean_ms"] - fetch["mean_ms"], 0.0)
    delivery, consumption = _rate(step["mean_ms"]), _rate(compute_ms)
    figures: dict[str, Any] = {
        "train_dataloader_next_share": fetch["share"],
        "train_dataloader_next_median_ms": fetch["median_ms"],
        "train_dataloader_next_mean_ms": fetch["mean_ms"],
        "step_mean_ms": step["mean_ms"],
        "delivery_batches_s": delivery,
        "consumption_batches_s": consumption,
        "num_workers": workers,
        "batch_size": batch_size,
        "cores": cores,
    }
    if batch_size:
        figures["delivery_img_s"] = delivery * batch_size
        figures["consumption_img_s"] = consumption * batch_size
    sentence = (
        f"The loader is the bottleneck: the step waits for data {fetch['share']:.0%} of its time"
        f" (train_dataloader_next {fetch['mean_ms']:.1f} ms of a {step['mean_ms']:.1f} ms step, means)."
        f" It delivers {_images(delivery, batch_size)}; the step would consume {_images(consumption, batch_size)}."
    )
    if workers is None:
        return {"figures": figures, "sentence": sentence + " Give the loader more workers."}
    # Per worker: all W are busy when the step waits; with none, the training thread is the one.
    per_worker = delivery / workers if workers > 0 else _rate(fetch["mean_ms"])
    needed = max(1, math.ceil(consumption / per_worker - 1e-9)) if math.isfinite(consumption) else None
    figures["per_worker_batches_s"] = per_worker
    figures["workers_needed"] = needed
    rate = f"At the measured {_images(per_worker, batch_size)} per worker"
    usable = None if cores is None else max(cores - 1, 0)  # one core runs the training process
    figures["usable_workers"] = usable
    if needed is None:
        sentence += " The step does nothing but wait: no worker count can be derived."
    elif usable is not None and workers >= usable:
        sentence += (
            f" The machine has no more cores to give ({cores} cores, {workers} workers and the training"
            " process): make each batch cheaper (image_size, augmentations, decodes per image) or use"
            " more cores."
        )
    elif usable is not None and needed > usable:
        reach = usable * per_worker
        sentence += (
            f" {rate}, {_workers(needed)} would close the gap, but only {usable} fit on {cores} cores"
            f" (one is the training process's): {_workers(usable)} reach about {_images(reach, batch_size)};"
            " beyond that, make each batch cheaper or use more cores."
        )
    else:
        sentence += f" {rate}, {_workers(needed)} ({needed - workers} more than {workers}) would close the gap."
    return {"figures": figures, "sentence": sentence}


def _optimizer_finding(
    opt: Mapping[str, float], context: Mapping[str, Any] | None, loader: Mapping[str, Any]
) -> dict[str, Any]:
    threads = list((context or {}).get("threads", []))
    figures = {
        "optimizer_step_stepped_median_ms": opt["stepped_median_ms"],
        "optimizer_step_isolated_ms": opt["isolated_ms"],
        "in_loop_over_isolated": opt["in_loop_over_isolated"],
        "optimizer_step_share": opt["share"],
        "threads_beside_isolated": threads,  # still alive when it was timed alone
        "num_workers": loader.get("num_workers"),
        "cores": loader.get("cores"),
    }
    workers, cores = loader.get("num_workers"), loader.get("cores")
    crowd = f" ({workers} workers on {cores} cores here)" if workers is not None and cores is not None else ""
    sentence = (
        f"The optimiser competes for cores: its step takes {opt['stepped_median_ms']:.1f} ms in the loop and"
        f" {opt['isolated_ms']:.1f} ms alone (x{opt['in_loop_over_isolated']:.2f}). It is not slow, it is"
        " starved. Usual causes: other work of this process during the step (its own threads, main-thread"
        f" work such as logging or metrics), more loader workers than the cores allow{crowd}, CPU-side"
        " augmentation in training_step (move it into the dataset's workers)."
    )
    return {"figures": figures, "sentence": sentence}


def _transfer_finding(transfer: Mapping[str, float], loader: Mapping[str, Any]) -> dict[str, Any]:
    pinned, device = loader.get("pin_memory"), loader.get("device")
    figures = {"batch_to_device_share": transfer["share"], "batch_to_device_median_ms": transfer["median_ms"],
               "pin_memory": pinned, "device": device}
    share = f"batch_to_device takes {transfer['share']:.0%} of the step ({transfer['median_ms']:.1f} ms median)"
    if device is not None and device != "cuda":  # no copy to pin for
        return {"figures": figures, "sentence": (
            f"The transfer step is significant on a {device} run, where nothing is copied to a device: {share};"
            " that is the transfer hooks' own work (on_before_batch_transfer, transfer_batch_to_device): make them"
            " cheaper.")}
    advice = (
        "the loader already pins memory: copy with non_blocking=True, or move less (uint8 images, masks at stride 4)"
        if pinned
        else "pin the loader's memory (pin_memory=True, the DataModule's default on CUDA) and copy with"
        " non_blocking=True"
    )
    return {"figures": figures, "sentence": f"Host-to-device copy is significant: {share}: {advice}."}


def _device_work_finding(work: Mapping[str, float], loader: Mapping[str, Any]) -> dict[str, Any]:
    device = loader.get("device")
    figures = {"device_work_share": work["share"], "device_work_median_ms": work["median_ms"], "device": device}
    sentence = (f"Work on the batch after its transfer takes {work['share']:.0%} of the step (device_work, i.e."
                f" on_after_batch_transfer, {work['median_ms']:.1f} ms median: the DataModule's pixels_on_device"
                " decode and warp or hsv_on_device jitter, or the model's own hook); it is not a copy.")
    if device is not None and device != "cuda":
        sentence += (f" On a {device} run it is the training process doing what the loader's workers could do in"
                     " parallel: set pixels_on_device: false and hsv_on_device: false (the workers make the pixels) and"
                     " give them the cores.")
    else:
        sentence += " On the accelerator it is part of the step's compute: cheaper augmentation, or accept it."
    return {"figures": figures, "sentence": sentence}


def judge_step_time(
    summary: Mapping[str, Mapping[str, float]],
    wall: Mapping[str, float] | None = None,
    loader: Mapping[str, Any] | None = None,
    isolated_context: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The verdict on a step-time summary: which rule fires, in a sentence, with its figures.

    Args:
        summary: :meth:`~seg_datamodule.profiling.callback.StepTimeProfiler.summary` (or a report's ``summary``): per phase
            ``median_ms``, ``mean_ms``, ``total_s``, ``share``; ``optimizer_step`` may add
            ``stepped_median_ms``, ``isolated_ms`` and ``in_loop_over_isolated``.
        wall: the report's ``wall`` (``train_s``, ``steps_s``, ``between_steps_s``,
            ``steps_share``); without it the time between steps is not judged.
        loader: what is known of the training loader: ``num_workers``, ``batch_size``,
            ``cores`` (available to this process), ``pin_memory``, and the ``device`` type the
            batches go to (``"cpu"``, ``"cuda"``); any may be missing or None.
        isolated_context: the report's ``isolated_context`` (threads beside the optimiser).

    Returns:
        dict | None: ``key`` (one of ``loader_bound``, ``optimizer_starved``, ``transfer_bound``,
        ``device_work``, ``between_steps``, ``compute_bound``), ``sentence``, ``figures`` (the table's numbers it
        rests on, under their table names, and what is derived from them), ``wall_share`` (the
        share of training wall time the finding accounts for), ``also`` (the other findings that
        fired, same keys, largest ``wall_share`` first) and ``thresholds``. ``None`` for an
        empty summary.
    """
    if not summary or "step" not in summary:
        return None
    loader = dict(loader or {})
    steps_share = 1.0
    if wall is not None and wall.get("steps_share") is not None and math.isfinite(wall["steps_share"]):
        steps_share = float(wall["steps_share"])
    findings: list[dict[str, Any]] = []

    def add(key: str, wall_share: float, finding: dict[str, Any]) -> None:
        findings.append({"key": key, "wall_share": wall_share, **finding})

    # 1. The rules that fire, each with the share of training wall time it accounts for.
    fetch_share = summary["train_dataloader_next"]["share"]
    if math.isfinite(fetch_share) and fetch_share >= THRESHOLDS["loader_share"]:
        add("loader_bound", fetch_share * steps_share, _loader_finding(summary, loader))
    opt = summary["optimizer_step"]
    ratio = opt.get("in_loop_over_isolated")
    if ratio is not None and math.isfinite(ratio) and ratio >= THRESHOLDS["optimizer_ratio"]:
        excess = opt["share"] * (1.0 - 1.0 / ratio) * steps_share  # the part beyond its cost alone
        add("optimizer_starved", excess, _optimizer_finding(opt, isolated_context, loader))
    transfer = summary["batch_to_device"]
    if math.isfinite(transfer["share"]) and transfer["share"] >= THRESHOLDS["transfer_share"]:
        add("transfer_bound", transfer["share"] * steps_share, _transfer_finding(transfer, loader))
    work = summary.get("device_work")
    if work is not None and math.isfinite(work["share"]) and work["share"] >= THRESHOLDS["device_work_share"]:
        add("device_work", work["share"] * steps_share, _device_work_finding(work, loader))
    if wall is not None and steps_share < 1.0 - THRESHOLDS["between_steps_share"]:
        between = 1.0 - steps_share
        add("between_steps", between, {
            "figures": {"between_steps_s": wall["between_steps_s"], "train_s": wall["train_s"],
                        "steps_s": wall["steps_s"], "between_steps_share": between},
            "sentence": f"Time between steps dominates: {between:.0%} of training wall time"
                        f" ({wall['between_steps_s']:.1f} s of {wall['train_s']:.1f} s) passed outside the steps"
                        " (validation, checkpointing, logging, epoch starts): validate or checkpoint less often"
                        " (check_val_every_n_epoch, limit_val_batches, every_n_train_steps).",
        })
    # 2. Nothing fired: the step is its own work.
    if not findings:
        compute = sum(summary[p]["share"] for p in ("forward", "backward", "optimizer_step"))
        add("compute_bound", compute * steps_share, {
            "figures": {"forward_backward_optimizer_share": compute, "train_dataloader_next_share": fetch_share,
                        "batch_to_device_share": transfer["share"], "step_median_ms": summary["step"]["median_ms"]},
            "sentence": f"The step is compute-bound: forward, backward and the optimiser step take {compute:.0%} of it,"
                        f" waiting for data {fetch_share:.0%}; nothing to fix on the data side.",
        })
    findings.sort(key=lambda f: -f["wall_share"])
    first, rest = findings[0], findings[1:]
    return {**first, "also": rest, "thresholds": dict(THRESHOLDS)}
