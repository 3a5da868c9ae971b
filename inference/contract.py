"""The contract every engine keeps: the local engine (serving/engine.py) and a model server's
(remote/engine.py). The page and the CLI use only what is here, and ask `capabilities` what an
engine can do, never which engine it is."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Protocol, runtime_checkable

from inference.sampling.settings import SETTINGS

if TYPE_CHECKING:
    from pathlib import Path

    import torch

    from inference.events import DoneEvent, PrefillEvent, PromptToken, StepEvent, TokenScore, WaitEvent
    from inference.model.anatomy import StepCapture
    from inference.model.config import ModelConfig
    from inference.request import RunRequest
    from inference.sampling.replay import StageStat
    from inference.sampling.params import SamplingParams
    from inference.sampling.state import RunState


@dataclass(frozen=True)
class Capabilities:
    """What an engine can compute, so that the page shows exactly that and says why not the rest."""
    # The model's weights and activations are here: replay from a step's whole logit vector,
    # the path through the layers, attention and the logit lens.
    internals: bool
    # Every token's probability at every step: both the raw and the final distribution per
    # candidate, the entropy, the chosen token's rank over the whole vocabulary.
    whole_distribution: bool
    # This run's KV-cache bytes and the paged pool are measured; otherwise counted by the formula.
    measured_kv: bool
    # The whole server's load (its KV cache and queue), beside this run's numbers.
    server_load: bool
    # Which distribution the per-candidate numbers are when not both: "raw" or "processed".
    logprobs: str = "both"
    # Times are measured where the model runs (True) or at the page, network and queue included.
    local_timing: bool = True
    # The probability mass a constraint (JSON schema, regex, grammar) removed at each step.
    masked_mass: bool = True
    # A tree of continuations grown from any point of a run (expand_tree): every node's children
    # above a probability, from the model's whole distribution there.
    tree: bool = False
    # The sampling settings (settings.SETTINGS names) it honours; the page offers only these.
    settings: frozenset = frozenset(s.name for s in SETTINGS)


@dataclass(frozen=True)
class EngineInfo:
    """What an engine is: for the model card and every byte count the page shows. Fields an
    engine cannot know are None, never made up."""
    name: str
    max_seq_len: int  # the context window
    cfg: "ModelConfig | None"  # the model's shapes (None: a server whose config is not given)
    capabilities: Capabilities
    where: str  # the device ("cpu", "cuda:0") or the server's URL
    # Bytes per KV-cache value, and how that was found out.
    kv_value_bytes: int | None
    kv_value_bytes_source: str = ""
    dtype: "torch.dtype | None" = None  # the weights' and the KV cache's, where known here
    decode_dtype: "torch.dtype | None" = None  # the weights' read by few-row (decode) matmuls
    kv_pool_blocks: int | None = None  # the paged KV cache's size, in blocks
    decode_error: object = None  # serving.precision.PrecisionReport when decode_dtype != dtype
    # A model on a GGUF file's quantized blocks: its matrices' bytes as stored (anatomy.stages'
    # `stored`); None where the weights are read at `decode_dtype`.
    stored_bytes: dict | None = None
    # A quantized model's products on a CPU (model/products.py's describe: path, kernels, bound);
    # None where the weights are float (or a server runs the model).
    products: dict | None = None
    # A model read from a GGUF file: the file's bytes by tensor type ({"Q4_K": ..., "F32": ...}).
    file_types: dict | None = None
    # In front of a server: which distribution its log-probabilities are, how that was found
    # out, and where the model's config.json was read.
    logprobs_source: str = ""
    config_source: str | None = None
    config_dtype: str | None = None
    # Chat mode is offered: the model has a chat template (a server's: its own to refuse).
    chat: bool = True
    # The local model's directory, which the quantization lens reads again in float32 (None: a
    # server's model, or one made in memory).
    model_dir: "Path | None" = None

    @property
    def kv_bytes_per_position(self) -> int | None:
        """2 × layers × KV heads × head dim × bytes per value, where both are known."""
        if self.cfg is None or self.kv_value_bytes is None:
            return None
        return self.cfg.kv_bytes_per_token(self.kv_value_bytes)


@runtime_checkable
class Tokenizer(Protocol):
    """What the page, the API and the CLI use of an engine's tokenizer: the local model's
    (loading/tokenizer.py, which knows each token's bytes) or a server's (remote/tokenizer.py,
    which asks the server; what it cannot know is None)."""
    vocab_size: int | None  # None: a server's, which checks its own ids
    bos_token: str | None
    eos_token: str | None
    chat_template: str | None
    token_bytes: list[bytes] | None  # every token's bytes, where known here

    def encode(self, text: str, add_bos: bool | None = None, controls: bool = False) -> list[int]:
        """Ids of a text as fed (add_bos None: as the model's config says); controls: control-token
        text a user wrote becomes the token."""

    def encode_continuation(self, text: str, controls: bool = False) -> list[int]:
        """Ids of text that continues other text (no BOS)."""

    def decode(self, ids: list[int]) -> str: ...

    def continuation_text(self, ids: list[int]) -> str:
        """The text of tokens that follow a prompt, as a run streams it (a piece's leading space
        kept, which decoding them alone would drop; a character they leave unfinished left out)."""

    def piece(self, token_id: int) -> str:
        """How the page shows one token (byte tokens as <0xNN>)."""

    def char_groups(self, ids: list[int]) -> list[tuple[range, bool]]:
        """Runs of ids that make whole characters together, and whether each run is complete."""

    def is_control(self, token_id: int) -> bool: ...


@runtime_checkable
class Engine(Protocol):
    """The methods the page and the CLI call. Input a user can get wrong raises InputError (one
    line); what an engine cannot do raises NotAvailable, and `capabilities` says so beforehand."""
    name: str
    tokenizer: Tokenizer
    generation_defaults: dict  # sampling defaults from the model's generation_config.json

    def describe(self) -> EngineInfo: ...

    @property
    def active_runs(self) -> int: ...

    @property
    def default_system_prompt(self) -> str: ...

    # -- prompt -> ids
    def check_prompt_size(self, prompt: str, chat: bool = False, system: str | None = None,
                          history: list[dict] | None = None) -> None: ...

    def prompt_text(self, prompt: str, chat: bool = False, system: str | None = None,
                    history: list[dict] | None = None) -> str: ...

    def prompt(self, prompt: str, chat: bool = False, system: str | None = None,
               history: list[dict] | None = None, controls: bool = False) -> tuple[str, list[int]]:
        """prompt_text and prompt_ids together, the chat template rendered once."""

    def prompt_ids(self, prompt: str, chat: bool = False, system: str | None = None,
                   history: list[dict] | None = None, controls: bool = False) -> list[int]:
        """controls: control-token text the user wrote becomes the token (the API's, as vLLM's)."""

    # -- generation and scoring (a run is prepared by inference.request.prepare_run)
    def check_run(self, request: "RunRequest") -> None:
        """What only this engine can check of a prepared request (prepare_run calls it)."""

    def run(self, request: "RunRequest", cancel: threading.Event | None = None
            ) -> "Iterator[StepEvent | WaitEvent | PrefillEvent | DoneEvent]":
        """Run a prepared request: its events; its failure raised here, that run's alone."""

    @property
    def max_seq_len(self) -> int:
        """The context window."""

    @property
    def vocab_size(self) -> "int | None":
        """The model's vocabulary (None: a server whose config is not known here)."""

    @property
    def down(self) -> "Exception | None":
        """Why the engine can no longer serve (its scheduler died), None while it serves."""

    def generate_ids(self, ids: list[int], params: "SamplingParams", top_n: int = 10,
                     cancel: threading.Event | None = None, given: list[int] = ()
                     ) -> "Iterator[StepEvent | WaitEvent | PrefillEvent | DoneEvent]":
        """given: tokens generated already after the prompt ids (a branch continues after them)."""

    def expand_tree(self, ids: list[int], given: list[int] = (), *, depth: int = 3, max_nodes: int = 64,
                    top_k: "int | None" = None, min_prob: "float | None" = None, limits=None,
                    cancel: threading.Event | None = None) -> "Iterator":
        """The tree of continuations after ids and given (capabilities.tree): a TreeStepEvent per
        level, then a TreeDoneEvent (decoding/tree.py); limits: a shared page's TreeLimits."""

    def score(self, context_ids: list[int], continuation: str) -> list[tuple[int, str, float]]: ...

    def prompt_logprobs(self, ids: list[int], top_n: int = 0) -> "list[PromptToken]": ...

    def text_ids(self, text: str) -> tuple[list[int], int]:
        """A typed text's ids as fed (a BOS where the model adds one), and how many of them come
        before the text's own tokens."""

    def score_ids(self, ids: list[int], top_n: int = 10) -> "list[TokenScore]":
        """Every token of ids given those before it, by one pass: log p in the model's own
        distribution, rank (None where a server does not say), the top_n preferred tokens;
        the first token's numbers are None (nothing precedes it)."""

    def generate_many(self, ids: list[int], params: "SamplingParams", n: int, top_n: int = 10,
                      cancel: threading.Event | None = None) -> "Iterator[tuple[int, object]]":
        """n samples (1..samples.MAX_SAMPLES), sample k with seed params.seed + k (a random
        start when None): (k, event) of each, as generate_ids yields them, until all end."""

    # -- what needs the model's insides (capabilities.internals)
    def step_logits(self, context_ids: list[int]) -> "torch.Tensor": ...

    def logits_along(self, ids: list[int], first: int) -> "torch.Tensor":
        """(len(ids) - first, vocab): the logits that predicted each of ids[first:]."""

    def replay(self, logits: "torch.Tensor", params: "SamplingParams", state: "RunState",
               chosen: int, shown=None) -> "tuple[list[StageStat], torch.Tensor]": ...

    def capture(self, context_ids: list[int], layer: int) -> "StepCapture": ...

    def attention_pattern(self, context_ids: list[int], layer: int) -> "torch.Tensor": ...

    # -- the whole server (capabilities.server_load)
    def server_load(self): ...

    # -- shutdown
    def close(self) -> None: ...
