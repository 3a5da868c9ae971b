"""The probability of a text: every token coloured by how likely the model found it."""
