"""Where a DataModule's data comes from: the splits a stage builds and their indices (``sources``), the checks every split passes (``checks``), and what each split holds, said at setup (``scan``)."""
