"""The built-in causal language model: a ``transformers`` GPT-2 architecture with random
weights (never downloaded), the byte tokenizer of ``tokenizer``, behind both generative
contracts of ``contract`` and the one-shot ``predict`` of ``instance.models``.

Variants (``VARIANTS``; the handler reference is ``gshare.runtime.instance.generative.
causal_lm:CausalLM`` — ``tiny`` under ``GSHARE_TINY_MODELS=1``, else ``gpt2-small`` — or
``:TinyCausalLM`` / ``:Gpt2SmallCausalLM``):

==========  =========================================  ======  =================  ==============
variant     GPT2Config                                 params  KV bytes / token   context
==========  =========================================  ======  =================  ==============
tiny        2 layers, hidden 64, 4 heads               0.1 M   1 KiB (fp32)       512 tokens
gpt2-small  12 layers, hidden 768, 12 heads (GPT-2)    85 M    72 KiB (fp32)      1024 tokens
==========  =========================================  ======  =================  ==============

(gpt2-small has GPT-2 small's shape except its vocabulary: 260 byte ids, not 50,257 BPE ids.)

The KV cache is per sequence (``_kv``: per layer a key and a value tensor ``[1, heads, len,
head_dim]``) while a sequence is not decoding. ``decode`` batches sequences of different
lengths in a *persistent padded batch* (``_Batch``): their caches stacked, each row left-padded
to the longest, with an attention mask over the padding and each sequence's own position ids.
The batch is kept from step to step while the same sequences decode (HF appends one token to
it). When a sequence joins, leaves, prefills or pauses, the next batch is built in one copy per
layer: the rows that stay move as one block, joiners are stacked in from their own caches, a
freed row is simply left out and a paused one is cut back out into its own cache.
bench/generate.py measured, for 16 sequences of 16 to 200 tokens on the tiny model (one CPU
thread): 1.4 ms per step kept, 2.5 ms when one sequence pauses and another resumes at every
step, 5.6 ms when every row is cut out and stacked again (the rebuild before), 7.2 ms decoding
each sequence alone.

Who calls it: the instance (``load`` once; ``generative.serving``), the engine (``generation_spec``,
``encode_prompt``, ``prefill``, ``decode``, ``free``, ``token_bytes``) on its one thread.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import torch
from torch import nn

from gshare.runtime.instance.generative.contract import (
    GenerationParams,
    GenerationSpec,
    PrefillWork,
    SeqView,
)
from gshare.runtime.instance.generative.sampling import pick_token
from gshare.runtime.instance.generative.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    VOCAB_SIZE,
    ByteTokenizer,
)
from gshare.runtime.instance.models import (
    InputError,
    build_on_meta,
    load_weights,
    resolve_device,
    seed_of,
    tiny_models,
)

VARIANTS: Final[dict[str, dict[str, int]]] = {
    "tiny": {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 512},
    "gpt2-small": {"n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024},
}

_Layer = tuple[torch.Tensor, torch.Tensor]


@dataclass(slots=True)
class _Batch:
    """The persistent decode batch: ``ids``' caches stacked, row i left-padded by ``pads[i]``."""

    ids: tuple[str, ...]
    pads: list[int]
    length: int
    layers: list[_Layer]
    gone: set[str] = field(default_factory=set)
    """Rows no longer read: freed sequences, and ones cut back out into their own caches."""


class CausalLM:
    """The built-in causal LM (module doc)."""

    variant: str | None = None

    def __init__(self, variant: str | None = None) -> None:
        v = variant or type(self).variant or ("tiny" if tiny_models() else "gpt2-small")
        if v not in VARIANTS:
            raise ValueError(f"unknown causal LM variant {v!r}: one of {', '.join(VARIANTS)}")
        self.variant_name = v
        self.tokenizer = ByteTokenizer()
        self.module: nn.Module | None = None
        self.device = "cpu"
        self._kv: dict[str, list[_Layer]] = {}
        """Per-sequence caches of the sequences that are not in ``_batch``."""
        self._batch: _Batch | None = None

    # -- construction ---------------------------------------------------------------------------

    def config(self) -> Any:
        from transformers import GPT2Config  # lazy: transformers is heavy

        kw: dict[str, Any] = {
            "vocab_size": VOCAB_SIZE,
            "bos_token_id": BOS_ID,
            "eos_token_id": EOS_ID,
            "pad_token_id": PAD_ID,
            # untied: tied random embeddings make the model echo its last byte
            "tie_word_embeddings": False,
            "attn_implementation": "sdpa",
            **VARIANTS[self.variant_name],
        }
        return GPT2Config(**kw)

    def build(self) -> nn.Module:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_config(self.config())  # type: ignore[no-any-return,no-untyped-call]

    @property
    def seed(self) -> int:
        return seed_of(f"causal-lm-{self.variant_name}")

    def random_module(self) -> nn.Module:
        """The architecture with its seeded random weights (the global RNG is left as it was)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return self.build()

    def initial_weights(self) -> dict[str, torch.Tensor]:
        """The weights to share in the node's model store (``instance.loading``)."""
        return {k: v.detach() for k, v in self.random_module().state_dict().items()}

    def load(self, weights: Mapping[str, torch.Tensor] | None, device: str) -> None:
        """Build the model from ``weights`` without copying them, or with its seeded random
        weights when None; eval mode, no gradients, on ``device``."""
        device = resolve_device(device)
        if weights is None:
            module = self.random_module()
        else:
            module = build_on_meta(self.build)
            load_weights(module, weights)
        module.requires_grad_(False)
        module.eval()
        if torch.device(device).type != "cpu":
            module.to(device)
        self.module, self.device = module, device
        self._kv.clear()
        self._batch = None

    def _model(self) -> nn.Module:
        if self.module is None:
            raise RuntimeError("CausalLM used before load")
        return self.module

    # -- the step-wise contract -----------------------------------------------------------------

    def generation_spec(self) -> GenerationSpec:
        cfg = VARIANTS[self.variant_name]
        dtype_bytes = 4 if self.module is None else next(self.module.parameters()).element_size()
        return GenerationSpec(
            kv_bytes_per_token=2 * cfg["n_layer"] * cfg["n_embd"] * dtype_bytes,
            max_context_tokens=cfg["n_positions"],
            eos_token_id=EOS_ID,
        )

    def encode_prompt(self, inputs: Any) -> list[int]:
        """A prompt: ``str``, UTF-8 ``bytes``, ``{"prompt": str}`` or a list of token ids."""
        if isinstance(inputs, Mapping):
            inputs = inputs.get("prompt", inputs.get("text"))
        if isinstance(inputs, str | bytes | bytearray | memoryview):
            return self.tokenizer.encode(bytes(inputs) if not isinstance(inputs, str) else inputs)
        if isinstance(inputs, list | tuple) and inputs and all(type(i) is int for i in inputs):
            bad = [i for i in inputs if not 0 <= i < VOCAB_SIZE]
            if bad:
                raise InputError(f"token ids must lie in [0, {VOCAB_SIZE}), got {bad[0]}")
            return list(inputs)
        raise InputError(
            'a prompt is a string, UTF-8 bytes, {"prompt": "..."} or a non-empty list of token ids'
        )

    def token_bytes(self, token_id: int) -> bytes:
        return self.tokenizer.token_bytes(token_id)

    def free(self, seq_id: str) -> None:
        bt = self._batch
        if bt is not None and seq_id in bt.ids:
            bt.gone.add(seq_id)  # its row stays, unread, until the next rebuild leaves it out
            if bt.gone.issuperset(bt.ids):
                self._batch = None  # no row is read any more: its memory goes now
        self._kv.pop(seq_id, None)

    def kv_tokens(self, seq_id: str) -> int:
        """Tokens the cache of ``seq_id`` holds (0 when it has none; tests check the engine's
        count against it)."""
        bt = self._batch
        if bt is not None and seq_id in bt.ids and seq_id not in bt.gone:
            return bt.length - bt.pads[bt.ids.index(seq_id)]
        kv = self._kv.get(seq_id)
        return 0 if kv is None else int(kv[0][0].shape[2])

    def _cut(self, bt: _Batch, i: int) -> None:
        """Row ``i`` of ``bt`` back into its sequence's own cache (copied without its padding;
        no copy for a batch of one without padding)."""
        sid = bt.ids[i]
        if len(bt.ids) == 1 and bt.pads[0] == 0:
            self._kv[sid] = bt.layers
        else:
            p = bt.pads[i]
            self._kv[sid] = [
                (k[i : i + 1, :, p:].clone(), v[i : i + 1, :, p:].clone()) for k, v in bt.layers
            ]
        bt.gone.add(sid)

    def _unbatch(self) -> None:
        """Give every live sequence of the persistent batch its own cache back."""
        bt, self._batch = self._batch, None
        if bt is None:
            return
        for i, sid in enumerate(bt.ids):
            if sid not in bt.gone:
                self._cut(bt, i)

    def _batch_for(self, seqs: Sequence[SeqView]) -> _Batch:
        """The persistent batch of exactly ``seqs`` (in order): kept from the last decode when
        it is the same sequences; else the next one, built in one copy per layer: the rows that
        stay move as one block (shifted by the change of the longest length), joining sequences
        are stacked in from their own caches, rows that left are dropped (freed ones) or cut
        back out (ones that only pause)."""
        ids = tuple(s.seq_id for s in seqs)
        bt = self._batch
        if bt is not None and bt.ids == ids and not bt.gone:
            return bt
        lens = [self.kv_tokens(sid) for sid in ids]
        longest = max(lens)
        rows = {} if bt is None else {s: i for i, s in enumerate(bt.ids) if s not in bt.gone}
        layers: list[_Layer]
        if bt is None or not any(sid in rows for sid in ids):
            self._unbatch()
            if len(ids) == 1:
                layers = self._kv.pop(ids[0])
            else:
                layers = stack_left_padded([self._kv.pop(sid) for sid in ids], lens, longest)
            self._batch = _Batch(ids, [longest - n for n in lens], longest, layers)
            return self._batch
        wanted = set(ids)
        for sid, i in rows.items():
            if sid not in wanted:
                self._cut(bt, i)
        new_pos = [j for j, sid in enumerate(ids) if sid in rows]
        old_pos = torch.tensor([rows[ids[j]] for j in new_pos], device=self.device)
        dst = torch.tensor(new_pos, device=self.device)
        joiners = [(j, self._kv.pop(sid)) for j, sid in enumerate(ids) if sid not in rows]
        shift = longest - bt.length  # < 0 when the longest sequence left: its padding goes
        layers = []
        for layer, (k, v) in enumerate(bt.layers):
            ks = k.new_zeros((len(ids), k.shape[1], longest, k.shape[3]))
            vs = v.new_zeros(ks.shape)
            ks[dst, :, max(0, shift) :] = k.index_select(0, old_pos)[:, :, max(0, -shift) :]
            vs[dst, :, max(0, shift) :] = v.index_select(0, old_pos)[:, :, max(0, -shift) :]
            for j, kv in joiners:
                n = lens[j]
                if n:
                    ks[j, :, longest - n :] = kv[layer][0][0]
                    vs[j, :, longest - n :] = kv[layer][1][0]
            layers.append((ks, vs))
        self._batch = _Batch(ids, [longest - n for n in lens], longest, layers)
        return self._batch

    @torch.no_grad()
    def prefill(self, work: Sequence[PrefillWork]) -> list[int | None]:
        """Each sequence's chunk on its own (batch 1): ``n_tokens`` from ``cached_tokens``."""
        from transformers import DynamicCache

        model = self._model()
        out_tokens: list[int | None] = []
        for w in work:
            seq, c, n = w.seq, w.seq.cached_tokens, w.n_tokens
            bt = self._batch
            if bt is not None and seq.seq_id in bt.ids and seq.seq_id not in bt.gone:
                self._cut(bt, bt.ids.index(seq.seq_id))
            if c != self.kv_tokens(seq.seq_id):
                raise RuntimeError(
                    f"{seq.seq_id}: engine counts {c} cached tokens, cache holds "
                    f"{self.kv_tokens(seq.seq_id)}"
                )
            ids = torch.tensor([seq.token_ids[c : c + n]], device=self.device)
            past = DynamicCache(ddp_cache_data=self._kv[seq.seq_id]) if c else DynamicCache()
            out = model(
                input_ids=ids,
                past_key_values=past,
                attention_mask=torch.ones(1, c + n, dtype=torch.long, device=self.device),
                position_ids=torch.arange(c, c + n, device=self.device).unsqueeze(0),
                use_cache=True,
            )
            cache = out.past_key_values
            self._kv[seq.seq_id] = [(layer.keys, layer.values) for layer in cache.layers]
            if c + n == len(seq.token_ids):
                out_tokens.append(pick_token(out.logits[0, -1], seq.params, c + n))
            else:
                out_tokens.append(None)
        return out_tokens

    @torch.no_grad()
    def decode(self, seqs: Sequence[SeqView]) -> list[int]:
        """One token for each sequence, in one batched forward (module doc: the persistent
        padded batch)."""
        from transformers import DynamicCache

        if not seqs:
            return []
        model = self._model()
        lens = [s.cached_tokens for s in seqs]
        for s, n in zip(seqs, lens, strict=True):
            if n != len(s.token_ids) - 1 or n != self.kv_tokens(s.seq_id):
                raise RuntimeError(
                    f"{s.seq_id}: not ready to decode ({n} cached of "
                    f"{len(s.token_ids)} tokens, cache {self.kv_tokens(s.seq_id)})"
                )
        bt = self._batch_for(seqs)
        mask = torch.ones(len(seqs), bt.length + 1, dtype=torch.long, device=self.device)
        for i, pad in enumerate(bt.pads):
            mask[i, :pad] = 0
        out = model(
            input_ids=torch.tensor([[s.token_ids[-1]] for s in seqs], device=self.device),
            past_key_values=DynamicCache(ddp_cache_data=bt.layers),
            attention_mask=mask,
            position_ids=torch.tensor([[n] for n in lens], device=self.device),
            use_cache=True,
        )
        bt.layers = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        bt.length += 1
        return [
            pick_token(out.logits[i, -1], s.params, len(s.token_ids)) for i, s in enumerate(seqs)
        ]

    # -- the streamed contract and predict -------------------------------------------------------

    def generate(self, inputs: Any, parameters: Mapping[str, Any]) -> Iterator[str]:
        """One request's completion as text chunks, without batching (an engine of one)."""
        from gshare.runtime.instance.generative.engine import GenerationEngine

        engine = GenerationEngine(self)
        got: list[str] = []
        seq = engine.submit(inputs, GenerationParams.parse(parameters), on_chunk=None)
        while not seq.finished:
            engine.step()
            for c in seq.drain():
                if c.text:
                    got.append(c.text)
            yield from got
            got.clear()

    def predict(
        self, inputs: list[Any], parameters: list[Mapping[str, Any]] | None = None
    ) -> list[Any]:
        """The whole completion of each prompt, batched by an engine (one-shot serving):
        ``{"text", "finish_reason", "tokens"}`` per input."""
        from gshare.runtime.instance.generative.engine import GenerationEngine

        engine = GenerationEngine(self)
        params = parameters or [{} for _ in inputs]
        seqs = [
            engine.submit(x, GenerationParams.parse(p), on_chunk=None)
            for x, p in zip(inputs, params, strict=True)
        ]
        engine.run_until_idle()
        out: list[Any] = []
        for s in seqs:
            chunks = s.drain()
            last = chunks[-1] if chunks else None
            if last is not None and last.error:
                raise InputError(last.error)
            out.append(
                {
                    "text": "".join(c.text for c in chunks),
                    "finish_reason": str(last.finish_reason) if last else "",
                    "tokens": len(s.generated),
                }
            )
        return out


def stack_left_padded(
    caches: Sequence[list[_Layer]], lens: Sequence[int], longest: int
) -> list[_Layer]:
    """Per layer, the sequences' keys and values stacked into ``[batch, heads, longest,
    head_dim]``, each left-padded with zeros (masked out by the caller's attention mask)."""
    out: list[_Layer] = []
    batch = len(caches)
    for layer in range(len(caches[0])):
        k0 = caches[0][layer][0]
        shape = (batch, k0.shape[1], longest, k0.shape[3])
        ks = k0.new_zeros(shape)
        vs = k0.new_zeros(shape)
        for i, kv in enumerate(caches):
            n = lens[i]
            if n:
                ks[i, :, longest - n :] = kv[layer][0][0]
                vs[i, :, longest - n :] = kv[layer][1][0]
        out.append((ks, vs))
    return out


class TinyCausalLM(CausalLM):
    """The ``tiny`` variant (tests, CPU benches)."""

    variant = "tiny"


class Gpt2SmallCausalLM(CausalLM):
    """The ``gpt2-small`` variant."""

    variant = "gpt2-small"


__all__ = ["VARIANTS", "CausalLM", "Gpt2SmallCausalLM", "TinyCausalLM", "stack_left_padded"]
