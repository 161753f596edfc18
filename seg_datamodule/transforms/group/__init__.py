"""Group steps across the samples of a batch: copy-paste and MixUp drawn and applied (``sample_mixing``) over their kernels (``copy_paste``, ``mixup``)."""
