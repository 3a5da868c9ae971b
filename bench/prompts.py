"""The benchmark's prompts: the same token ids for every system measured."""

FILLER = ("The history of computing is a story of people who wanted to calculate faster. "
          "Mechanical calculators gave way to relays, relays to vacuum tubes, and tubes to "
          "transistors, each step making machines smaller, cheaper and more reliable. ")


def prompt_ids(tokenizer, n: int) -> list[int]:
    """n token ids of filler text (no BOS), from our tokenizer (identical to the model's own)."""
    return tokenizer.encode(FILLER * (n // 20 + 2), add_bos=False)[:n]
