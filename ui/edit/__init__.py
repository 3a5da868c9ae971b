"""Edit and continue: the output edited, tokenized in context, and the run continued from it as token ids."""
