"""What one visitor may cost, and who a visitor is: the limits of a shared page and of the API
beside it, their refusals' words, and the concurrency ids of the page's events.

A client is the visitor's login with --auth, else their IP address. Behind a proxy on this
machine (the --share tunnel's client connects from 127.0.0.1), uvicorn takes the address from
the proxy's X-Forwarded-For; a proxy that sends none makes every visitor one client.
"""


from __future__ import annotations

from dataclasses import dataclass, replace

ENGINE = "engine"  # the concurrency id of every event that runs the model
# Picking a model: not an engine job (a run clicked while its model loads waits for the load,
# never refused as a second job); loads are one at a time (Models) and once per model.
MODEL_PICK = "model-pick"

RUN_GOING = "You already have a run going: wait for it to finish, or press Stop."


def runs_message(n: int, cap: int) -> str:
    return (f"You already have {n} run{'s' if n != 1 else ''} going or waiting (from other tabs or "
            f"scripts); the server allows {cap} at a time per visitor. Wait for one to finish.")


def sessions_message(cap: int, idle_s: float) -> str:
    return (f"You have {cap} sessions open; the server allows {cap} per visitor. Close a tab, or "
            f"wait {max(1, round(idle_s / 60))} minutes for an idle one to expire.")


def samples_message(cap: int, asked) -> str:
    return f"The server allows at most {cap} samples at once; got {asked}."


def score_message(cap: int, n: int) -> str:
    return (f"The server scores texts of at most {cap:,} tokens (each costs its keys and values in memory); "
            f"this one is {n:,}. Shorten it.")


def lens_message(cap: int, asked: int) -> str:
    return (f"The server's quantization lens measures at most {cap} precision{'s' if cap != 1 else ''} besides "
            f"float32 per visitor (each is a copy of the model held while it is measured); {asked} were picked. "
            "Pick fewer.")


class Refused(Exception):
    """A limit said no; the message is shown as is."""


@dataclass(frozen=True)
class Limits:
    """None means no limit. Limits() is the local playground; Limits.shared() a public link."""
    max_new_tokens: int | None = None  # a run's max new tokens, at most
    runs_per_client: int | None = None  # engine jobs queued or running per client
    sessions_per_client: int | None = None  # sessions a client holds (idle ones expire)
    session_capacity: int | None = None  # sessions the server keeps state for, all clients
    max_samples: int | None = None  # samples drawn at once by "Many samples" (at most samples.MAX_SAMPLES)
    max_score_tokens: int | None = None  # tokens of a text scored in one pass (a prompt's log-probabilities)
    lens_precisions: int | None = None  # precisions besides float32 one quantization lens measures (each held in turn)
    max_tree_nodes: int | None = None  # nodes of one loom's tree (at most decoding.tree.MAX_NODES)

    @classmethod
    def shared(cls, **overrides) -> "Limits":
        """The defaults of a --share page; overrides of None keep the default, 0 means no limit."""
        base = cls(max_new_tokens=512, runs_per_client=1, sessions_per_client=8, session_capacity=256,
                   max_samples=16, max_score_tokens=2048, lens_precisions=2, max_tree_nodes=64)
        values = {k: v for k, v in overrides.items() if v is not None}
        return replace(base, **{k: (None if v == 0 else v) for k, v in values.items()})

    @classmethod
    def local(cls, **overrides) -> "Limits":
        return replace(cls(), **{k: (None if v == 0 else v) for k, v in overrides.items() if v is not None})

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.max_new_tokens, self.runs_per_client, self.sessions_per_client,
                                           self.max_samples, self.max_score_tokens, self.lens_precisions,
                                           self.max_tree_nodes))

    def score_refusal(self, n_tokens: int) -> str | None:
        """Why a text of n_tokens is not scored here (a shared page's bound), else None."""
        cap = self.max_score_tokens
        return score_message(cap, n_tokens) if cap is not None and n_tokens > cap else None

    def lens_refusal(self, asked: int) -> str | None:
        """Why a quantization lens of `asked` precisions besides float32 is not run here (a shared
        page's bound per visitor), else None."""
        cap = self.lens_precisions
        return lens_message(cap, asked) if cap is not None and asked > cap else None


def client_key(request) -> str:
    """The visitor: their login (with --auth), else their address. Takes a gr.Request, a
    gradio queue Event or a Starlette request."""
    user = getattr(request, "username", None)
    if user:
        return f"user {user}"
    client = getattr(request, "client", None)
    if client is None:  # a queue Event holds the fastapi request
        client = getattr(getattr(request, "request", None), "client", None)
    host = getattr(client, "host", None)
    return f"address {host}" if host else "local"


