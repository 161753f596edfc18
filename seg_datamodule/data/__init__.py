"""The data path's Lightning end: samples, sampler, worker-side collate, the DataModule, counts."""
