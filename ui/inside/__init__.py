"""Inside one token: the path through the model, attention, the logit lens."""
