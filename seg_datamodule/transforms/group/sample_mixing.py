"""Copy-paste and MixUp across the samples of a batch: the random draws and their application.

:class:`SampleMixing` holds the parameters (checked in ``__init__``) and draws from each
sample's own generator, after everything the sample itself drew, so a batch stays a pure
function of ``(seed, epoch, indices)`` and the samples before mixing are unchanged. Partners are
other samples of the same *group* (the batch; for a sample built alone, the dataset), picked by
a shift ``1..G-1`` from the sample's position, and always in the state before any mixing, so the
order in which samples are mixed does not matter. Batch partners are already decoded: mixing
costs no JPEG decode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import numpy as np

from seg_datamodule.ops.checks import check_choice, check_number
from seg_datamodule.structures import Sample
from seg_datamodule.transforms.group.copy_paste import flipped_source, paste_instances, select_for_paste
from seg_datamodule.transforms.group.mixup import MIXUP_BETA, mixup_samples
from seg_datamodule.transforms.steps import GroupStep, MixResult, step_arguments

__all__ = ["MixDraw", "MixResult", "SampleMixing"]


@dataclass(frozen=True)
class MixDraw:
    """One sample's mixing draw.

    Attributes:
        paste (bool): apply copy-paste.
        paste_shift (int): the paste source's position minus the sample's, modulo the group size
            (``batch`` mode; 0 for the sample itself, as in ``flip`` mode or a group of one).
        mix (bool): apply MixUp.
        mix_shift (int): the MixUp partner's shift (0: no partner, MixUp is skipped).
        ratio (float): MixUp weight of the sample's own pixels, ``Beta(32, 32)``.
    """

    paste: bool
    paste_shift: int
    mix: bool
    mix_shift: int
    ratio: float


class SampleMixing(GroupStep):
    """Copy-paste and MixUp for training samples: the group step the flat keys build.

    Args:
        copy_paste (float): probability of copy-paste per sample.
        copy_paste_mode (str): ``"flip"``: paste a subset of the sample's own instances from its
            mirror image; ``"batch"``: from another sample of the batch.
        mixup (float): probability of MixUp per sample (after copy-paste), with another sample
            of the batch.
        min_area_ratio (float): an instance keeping fewer than this fraction of its pixels under
            pasted objects is dropped as ``occluded``.
        min_box_size (float): so is one whose visible box is narrower or lower than this.

    Raises:
        TypeError, ValueError: an argument is out of range.
    """

    def __init__(
        self,
        copy_paste: float = 0.0,
        copy_paste_mode: Literal["flip", "batch"] = "flip",
        mixup: float = 0.0,
        min_area_ratio: float = 0.1,
        min_box_size: float = 2.0,
    ) -> None:
        with step_arguments("SampleMixing"):  # a YAML recipe's mistake reads "SampleMixing: ..."
            self.copy_paste = check_number("copy_paste", copy_paste, 0.0, 1.0)
            self.copy_paste_mode = check_choice("copy_paste_mode", copy_paste_mode, ("flip", "batch"))
            self.mixup = check_number("mixup", mixup, 0.0, 1.0)
            self.min_area_ratio = check_number("min_area_ratio", min_area_ratio, 0.0, 1.0)
            self.min_box_size = check_number("min_box_size", min_box_size)

    def __repr__(self) -> str:
        return (f"SampleMixing(copy_paste={self.copy_paste}, copy_paste_mode={self.copy_paste_mode!r}, "
                f"mixup={self.mixup})")

    @property
    def enabled(self) -> bool:
        """Whether anything can happen (if not, nothing is drawn and samples pass through)."""
        return self.copy_paste > 0.0 or self.mixup > 0.0

    def draw(self, rng: np.random.Generator, group_size: int) -> MixDraw:
        """Draw the sample's copy-paste and MixUp decisions and partners.

        Always draws the same five numbers (four uniforms and the Beta ratio), whatever the
        parameters, so changing one does not shift the draws that follow.

        Args:
            rng (numpy.random.Generator): the sample's generator.
            group_size (int): samples the partners come from (the batch, or the dataset).
        """
        u = rng.random(4)
        ratio = float(rng.beta(MIXUP_BETA, MIXUP_BETA))
        others = group_size - 1

        def shift(x: float) -> int:
            return 1 + min(int(x * others), others - 1) if others > 0 else 0

        paste_shift = shift(u[1]) if self.copy_paste_mode == "batch" else 0
        return MixDraw(paste=bool(u[0] < self.copy_paste), paste_shift=paste_shift,
                       mix=bool(u[2] < self.mixup), mix_shift=shift(u[3]), ratio=ratio)

    def apply(
        self,
        rng: np.random.Generator,
        sample: Sample,
        draw: MixDraw,
        paste_source: Sample | None,
        mix_partner: Sample | None,
    ) -> MixResult:
        """Copy-paste, then MixUp, as drawn.

        Args:
            rng (numpy.random.Generator): the sample's generator (which instances to paste).
            sample (Sample): the sample before mixing (left unchanged).
            draw (MixDraw): from :meth:`draw`.
            paste_source (Sample | None): ``batch`` mode: the partner at ``draw.paste_shift``
                (before mixing); ignored in ``flip`` mode.
            mix_partner (Sample | None): the partner at ``draw.mix_shift`` (before mixing).

        Returns:
            MixResult.
        """
        out, pasted, mixed_in, occluded = sample, 0, 0, 0
        if draw.paste:
            source = flipped_source(sample) if self.copy_paste_mode == "flip" else paste_source
            if source is not None and source.num_instances:
                pick = select_for_paste(rng, source.num_instances)
                out, occluded = paste_instances(out, source, pick, min_area_ratio=self.min_area_ratio,
                                                min_box_size=self.min_box_size)
                pasted = int(pick.sum())
        if draw.mix and mix_partner is not None:
            out = mixup_samples(out, mix_partner, draw.ratio)
            mixed_in = mix_partner.num_instances
        return MixResult(out, pasted=pasted, mixed_in=mixed_in, occluded=occluded)

    def mix_group(self, rngs: Sequence[np.random.Generator], samples: Sequence[Sample]) -> list[MixResult]:
        """Mix every sample of a group (a batch) with partners from the same group.

        Args:
            rngs: each sample's generator, after the sample's own draws.
            samples: the group's samples before mixing (left unchanged; each is a partner of
                others in this state).

        Returns:
            one :class:`MixResult` per sample, in order.
        """
        group = len(samples)
        out = []
        for b, (rng, sample) in enumerate(zip(rngs, samples)):
            draw = self.draw(rng, group)
            source = samples[(b + draw.paste_shift) % group] if draw.paste_shift else None
            partner = samples[(b + draw.mix_shift) % group] if draw.mix_shift else None
            out.append(self.apply(rng, sample, draw, source, partner))
        return out

    def mix_one(self, rng: np.random.Generator, sample: Sample, group_size: int,
                partner: Callable[[int], Sample]) -> MixResult:
        """Mix a sample built alone with partners from a group of ``group_size`` (the dataset).

        Args:
            rng (numpy.random.Generator): the sample's generator, after the sample's own draws.
            sample (Sample): the sample before mixing (left unchanged).
            group_size (int): samples the partners come from.
            partner: ``partner(shift)`` builds the group's sample ``shift`` places on, before any
                mixing; called once per shift drawn and applied, in increasing order.

        Returns:
            MixResult.
        """
        draw = self.draw(rng, group_size)
        need = {draw.paste_shift if draw.paste else 0, draw.mix_shift if draw.mix else 0} - {0}
        bases = {k: partner(k) for k in sorted(need)}
        return self.apply(rng, sample, draw, bases.get(draw.paste_shift), bases.get(draw.mix_shift))
