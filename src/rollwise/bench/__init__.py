"""``rollwise bench``: side-by-side comparisons, one module per command (``bench async`` is
``async_mode``); what they share — settings, warm start, runs, the noise floor, paired effects,
results JSON, tables — is ``harness``."""
