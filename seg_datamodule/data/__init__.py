"""The data path's Lightning end: the DataModule and what it holds.

- ``datamodule``: ``COCOSegDataModule``, the LightningDataModule a config's ``data:`` section builds;
- ``config/``: its flat YAML keys (``keys``) checked into typed option objects (``options``);
- ``splits/``: which splits a stage builds and their indices (``sources``), the checks every split
  passes (``checks``), what each split holds, said at setup (``scan``);
- ``samples/``: building samples, the dataset (``dataset``) over the one pipeline (``pipeline``),
  decode planning (``tiles``, ``decoding``), the index's targets (``targets``), predict samples
  (``predict``);
- ``batching/``: the worker-side collate (``collate``), its shared memory (``shm``), the allocator
  setting (``allocator``);
- ``loaders/``: where every DataLoader is made (``build``) and the arguments they share
  (``arguments``), samplers (``sampler``, ``repeat_factors``), mid-epoch resume (``resume``),
  streamed batches (``streaming``), the loader probe (``probe``);
- ``counts``: every counter of where annotations went (skipped by reason, delivered to training,
  consumed by evaluation) and the report line they make; ``report``: ``RunCounts``, a whole run's
  counts per source and reason, printed and saved.
"""
