"""The many-samples panel: N samples of the run at once, their outcomes and the first step against the model."""
