"""The DataModule's configuration: its flat YAML keys (``keys``) checked into frozen, typed option objects (``options``)."""
