"""The tier ladder: which model (or gear of one model) makes a token, and the KV caches they keep."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import (
    RotatingKVCache,
    can_trim_prompt_cache,
    make_prompt_cache,
    trim_prompt_cache,
)

from ..errors import UsageError
from ..kernels.quant_cpu import INT8_MAX_POSITIONS
from ..models.cpu_blocks import decoding_caches
from ..models.heads import SplitModel, split_model
from ..models.model_bytes import bytes_per_token
from ..models.numpy_cache import arrays_to_evaluate
from ..models.packed_cache import PLAIN_CACHES, can_pack, packed_caches
from ..models.weights import LoadedModel
from ..routing.probe import SCALARS, Probe
from ..tier_names import local_tier_names
from .draft_memory import DraftMemory

_UNCHECKED = object()  # a CacheGroup's split before it is checked
# A pass of more rows (a prompt, a long catch-up) runs alone: a packed pass hands every row its
# conversation's keys and values, which for hundreds of rows costs more memory than it saves; and
# a CPU rounds activations to int8 only in passes of up to this many positions a sequence, which
# every packed row gets, so a packed input must be one its own pass would round too.
PACKED_MAX_ROWS = INT8_MAX_POSITIONS


@dataclass(eq=False)
class CacheGroup:
    """One model's KV cache and how many of the conversation's token ids it holds (`seen`).

    The group owns its position: only `feed`, `score`, `score_together`, `rewind`, `restore` and
    `reset` move it. Gear tiers of one
    model share a group; `prefill_gear` is the gear that writes lasting K/V for long inputs.
    """

    model: LoadedModel
    name: str = ""
    prefill_gear: int | None = None
    max_kv_size: int | None = None
    cache: list = field(default_factory=list)
    seen: int = 0
    # Where the answer being decoded begins (its prompt's length), set as its loop is built: ids
    # from there on are the answer's own, which `_prefill` computes as steps do (None: none known).
    answer_from: int | None = None
    _split: object = field(default=_UNCHECKED, repr=False)  # checked_split's answer, once known

    def __post_init__(self) -> None:
        if not self.cache:
            self.reset()

    @property
    def trimmable(self) -> bool:
        """Whether the cache can drop its newest tokens (attention caches can; recurrent ones not)."""
        return can_trim_prompt_cache(self.cache)

    def feed(
        self, inputs: mx.array, gear: int | None, chunk: int, split: SplitModel | None = None
    ) -> tuple[mx.array, mx.array | None]:
        """Run the model over `inputs` (ids after `seen`); lazy logits of the last position, and
        its hidden state when `split` (this model's checked body/head split) is given.

        Ids before the last need no logits: they go through the model's body only, in the same
        pass as the last where they fit in one chunk (see `_prefill`).
        """
        inputs = self._prefill(inputs, 1, chunk, gear)
        self.seen += inputs.size
        self._activate(gear)
        split = split or self.checked_split()
        if split is None:
            return self.model.model(inputs[None], cache=self.cache)[:, -1, :], None
        hidden = split.body(inputs[None], cache=self.cache)[:, -1:, :]
        return split.head(hidden)[:, -1, :], hidden[0, -1]

    def score(
        self, inputs: mx.array, rows: int, gear: int | None, chunk: int, draft: bool = False
    ) -> mx.array:
        """Run the model over `inputs` (ids after `seen`); lazy logits (rows, V) of the last `rows`
        positions, in one batched pass (verify.py checks a draft with them). `draft`: a drafter's
        pass, on its draft head where it has one (only the ids a draft proposes: Score.draft)."""
        inputs = self._prefill(inputs, rows, chunk, gear)
        self.seen += inputs.size
        self._activate(gear)
        split = self.checked_split()
        if split is None:
            return self.model.model(inputs[None], cache=self.cache)[0, -rows:]
        return split.head_for(draft)(split.body(inputs[None], cache=self.cache)[:, -rows:, :])[0]

    @staticmethod
    def score_together(
        passes: list[tuple[CacheGroup, mx.array, int]], gear: int | None, chunk: int, draft: bool = False
    ) -> list[mx.array]:
        """Several conversations' passes on one model, each `(group, inputs, rows)` as `score`
        takes it (the groups hold different conversations of the same model): their lazy logits,
        (rows, V) each, as each group's own `score` would give them. Each is first prefilled as
        its own pass would be (a long input in chunks; at the prefill gear, all but the rows it
        reads); the rest of those that fit run as one packed pass (models/packed_cache.py), every row through
        each linear layer in one product, and a long rest (a prompt) runs alone."""
        out: list[mx.array | None] = [None] * len(passes)
        packed: list[tuple[int, CacheGroup, mx.array, int]] = []
        for i, (group, inputs, rows) in enumerate(passes):
            if len(passes) > 1 and group.checked_split() is not None and can_pack(group.cache):
                # What its own pass would prefill first is prefilled so here too.
                inputs = group._prefill(inputs, rows, chunk, gear)
                if inputs.size <= PACKED_MAX_ROWS:
                    packed.append((i, group, inputs, rows))
                    continue
            out[i] = group.score(inputs, rows, gear, chunk, draft)
        if len(packed) == 1:  # nothing to pack it with
            i, group, inputs, rows = packed[0]
            out[i] = group.score(inputs, rows, gear, chunk, draft)
        elif packed:
            sizes = [int(inputs.size) for _, _, inputs, _ in packed]
            caches = packed_caches([group.cache for _, group, _, _ in packed], sizes)
            ids = mx.concatenate([inputs.reshape(-1) for _, _, inputs, _ in packed])[:, None]
            wanted: list[int] = []
            start = 0
            for (_, group, _, rows), n in zip(packed, sizes, strict=True):
                group.seen += n
                wanted += range(start + n - rows, start + n)
                start += n
            first = packed[0][1]
            first._activate(gear)
            split = first.checked_split()
            assert split is not None
            hidden = split.body(ids, cache=caches)[:, 0, :]  # (R, D): row r is sequence r
            logits = split.head_for(draft)(hidden[mx.array(wanted)])
            start = 0
            for i, _, _, rows in packed:
                out[i] = logits[start : start + rows]
                start += rows
        assert all(o is not None for o in out)
        return cast(list[mx.array], out)

    def fork(self) -> CacheGroup:
        """The same model with an empty cache of its own (another conversation at once); the
        body/head split is checked once, here, and shared (the check runs the model)."""
        split = self.checked_split()
        return CacheGroup(self.model, self.name, self.prefill_gear, self.max_kv_size, _split=split)

    def checked_split(self) -> SplitModel | None:
        """This model's body/head split, checked once on it (heads.py); None for other layouts."""
        if self._split is _UNCHECKED:
            try:
                self._split = split_model(self.model.model, self.model.name)
            except UsageError:
                self._split = None
        return cast(SplitModel | None, self._split)

    def _prefill(self, inputs: mx.array, keep: int, chunk: int, gear: int | None) -> mx.array:
        """Fill the cache, in chunks, with the ids the pass that reads logits need not take;
        return the ids left for that pass (the last `keep` at least).

        Evaluating the cache state alone skips the output head for these ids on a lazy route (as
        mlx-lm's prefill does); running the body alone skips it on the CPU's eager kernels too.
        Ids that fit one decoding pass (INT8_MAX_POSITIONS, where the model splits into body and
        head at the gear asked for) all ride in the pass that reads the logits, which saves a
        pass (a catch-up plus the next token was two) and its sync: a decoding pass computes each
        position as a step would, so the bits are those of separate passes. Longer inputs are
        split as mlx-lm's generate splits a prompt: all but the last `keep` filled here in chunks
        from the start, then those `keep` alone. A prefill pass computes otherwise than a step (fp32
        activations, batched attention), so a prompt's last position computed inside it got other
        bits than mlx-lm's batch (`serve`'s one-model path then) gave it, and at times another answer.
        At another prefill gear all but `keep` are filled here: cheap gears never write lasting
        low-precision K/V for a prompt.
        """
        split = self.checked_split()
        same_gear = self.prefill_gear is None or self.prefill_gear == gear
        rides = same_gear and split is not None and inputs.size <= INT8_MAX_POSITIONS
        leave = inputs.size if rides else keep
        if inputs.size > leave:
            self._activate(self.prefill_gear)
        # A NumPy-routed head is computed when called, not when read: the body alone, where it splits.
        fill = split.body if split is not None else self.model.model
        while inputs.size > leave:
            # The answer's own ids in pieces one decoding pass takes, each computed as a step
            # computes it however long the catch-up: their bits (a routed answer's next tier, its
            # tokens) then do not hang on how its passes were planned. The prompt's in `chunk`
            # pieces, none running into the answer.
            answer_from = self.answer_from if self.answer_from is not None else self.seen + inputs.size
            piece = INT8_MAX_POSITIONS if self.seen >= answer_from else min(chunk, answer_from - self.seen)
            part = inputs[: min(piece, inputs.size - leave)]
            fill(part[None], cache=self.cache)
            mx.eval([arrays_to_evaluate(c) for c in self.cache])
            mx.clear_cache()  # mlx-lm's habit after each prefill chunk: give back the temporaries
            self.seen += part.size
            inputs = inputs[part.size :]
        return inputs

    def rewind(self, keep: int) -> int:
        """Keep the first `keep` tokens (trimmed, else started over); how many must be fed again."""
        if keep >= self.seen:
            return 0
        if self.trimmable:
            trim_prompt_cache(self.cache, self.seen - keep)
            self.seen = keep
            return 0
        self.reset()
        return keep

    def restore(self, cache: list, seen: int) -> None:
        """Take over `cache`, which holds a conversation's first `seen` ids (a kept one's)."""
        self.cache, self.seen = cache, seen

    def reset(self) -> None:
        """Forget everything the cache holds."""
        self.cache = decoding_caches(self.model.model, make_prompt_cache(self.model.model))
        if self.max_kv_size is not None:
            self.cache = _rotating(self.cache, self.max_kv_size, self.model.name)
        self.seen = 0

    def limit_cache(self, max_kv_size: int | None) -> None:
        """Keep at most `max_kv_size` tokens (mlx-lm's rotating cache); starts the cache over."""
        if max_kv_size != self.max_kv_size:
            self.max_kv_size = max_kv_size
            self.reset()

    def _activate(self, gear: int | None) -> None:
        if gear is not None:
            self.model.model.gear_state.set(gear)


def _rotating(cache: list, max_kv_size: int, name: str) -> list:
    """Rotating caches in place of plain ones: mlx-lm's make_prompt_cache ignores max_kv_size for
    a model with its own make_cache (llama, qwen2 …), so the bound is applied here for all."""
    if not all(type(c) in PLAIN_CACHES for c in cache):
        kinds = ", ".join(sorted({type(c).__name__ for c in cache} - {c.__name__ for c in PLAIN_CACHES}))
        raise UsageError(f"--max-kv-size cannot bound {name}'s cache ({kinds} layers); leave it out")
    # keep=4: mlx-lm's own choice, the first tokens stay (attention sinks).
    return [RotatingKVCache(max_size=max_kv_size, keep=4) for _ in cache]


@dataclass(eq=False)
class Tier:
    """A rung of the ladder: a name, the cache group it decodes with and, for gears, its gear."""

    name: str
    group: CacheGroup
    gear: int | None = None

    def __post_init__(self) -> None:
        self.bytes_per_token = bytes_per_token(self.group.model.model, self.gear)

    @property
    def model(self) -> LoadedModel:
        """The loaded model this tier runs."""
        return self.group.model

    def activate(self) -> None:
        """Make the model compute at this tier's gear (for running the module directly)."""
        if self.gear is not None:
            self.group.model.model.gear_state.set(self.gear)


class _Models(nn.Module):
    """Several models as one module: mlx-lm's wired_limit sizes the one module it is given."""

    def __init__(self, models: list[nn.Module]):
        super().__init__()
        self.models = models


@dataclass
class Ladder:
    """Tiers from cheapest to strongest, with the tokenizer they all share."""

    tiers: list[Tier]
    description: str = ""
    note: str = ""  # the profile's own words about it, shown under the chat's title
    probe: Probe | None = None  # the learned signal (attach_probe)
    # What verified drafting learned here (pass costs, kept shares), kept across answers.
    draft_memory: DraftMemory = field(default_factory=DraftMemory)
    # What each rung learned checking prompt-lookup drafts itself (the token loop's lookup):
    # its pass costs and kept shares, by rung.
    rung_memory: dict[int, DraftMemory] = field(default_factory=dict)
    _bottom_split: SplitModel | None = field(default=None, repr=False)

    def bottom_split(self) -> SplitModel:
        """The bottom model's checked body/head split (checked once; a UsageError for other layouts)."""
        if self._bottom_split is None:
            bottom = self.tiers[0]
            state = getattr(bottom.model.model, "gear_state", None)
            found = state.gear if state is not None else None
            bottom.activate()  # the check runs a forward pass at the gear the probe reads
            try:
                self._bottom_split = split_model(bottom.model.model, bottom.model.name)
            finally:
                if state is not None and found is not None:
                    state.set(found)
        return self._bottom_split

    def weights(self) -> nn.Module:
        """Every distinct model of the ladder as one module (a pair's two, a gear ladder's one)."""
        return _Models([g.model.model for g in self.groups])

    def attach_probe(self, probe: Probe) -> None:
        """Route on `probe`, once it is checked to read this bottom model's hidden state."""
        split = self.bottom_split()
        if probe.dims != split.hidden_size + len(SCALARS):
            raise UsageError(
                f"the saved probe reads {probe.dims - len(SCALARS)} hidden dimensions but "
                f"{self.tiers[0].model.name} has {split.hidden_size}: run `mlxswitch calibrate` again"
            )
        self.probe = probe

    @property
    def groups(self) -> list[CacheGroup]:
        """Distinct cache groups, bottom first."""
        out: list[CacheGroup] = []
        for tier in self.tiers:
            if all(tier.group is not g for g in out):
                out.append(tier.group)
        return out

    @property
    def tokenizer(self):
        """The tokenizer every tier shares (the bottom tier's)."""
        return self.tiers[0].model.tokenizer

    @property
    def tier_names(self) -> list[str]:
        """Names of the tiers, bottom first."""
        return [t.name for t in self.tiers]

    @property
    def vocab_size(self) -> int:
        """Length of the bottom tier's output distribution (the router's log2 V)."""
        return self.tiers[0].model.vocab_size

    @property
    def context_length(self) -> int:
        """The shortest context among the tiers' models."""
        return min(g.model.context_length for g in self.groups)

    def reset(self) -> None:
        """Empty every cache."""
        for group in self.groups:
            group.reset()

    def begin_answer(self, prompt_tokens: int) -> None:
        """An answer begins after the conversation's first `prompt_tokens` ids (CacheGroup.answer_from)."""
        for group in self.groups:
            group.answer_from = prompt_tokens

    def fork(self) -> Ladder:
        """The same tiers on the same models, with caches of their own: another conversation
        decoded beside this one (a server's batch). What drafting learns is shared."""
        forks = {id(g): g.fork() for g in self.groups}
        tiers = [Tier(t.name, forks[id(t.group)], t.gear) for t in self.tiers]
        return Ladder(
            tiers,
            self.description,
            self.note,
            self.probe,
            self.draft_memory,
            self.rung_memory,
            self._bottom_split,
        )

    def lookup_memory(self, rung: int) -> DraftMemory:
        """What `rung` learned checking lookup drafts on this ladder (shared by its forks)."""
        return self.rung_memory.setdefault(rung, DraftMemory())


def single_model_ladder(model: LoadedModel, name: str = local_tier_names(1)[0]) -> Ladder:
    """A one-tier ladder: plain decoding on one model."""
    return Ladder([Tier(name, CacheGroup(model, name))], description=model.name)


def pair_ladder(small: LoadedModel, large: LoadedModel) -> Ladder:
    """A small → large ladder; the models must share a tokenizer (checked by the caller)."""
    names = local_tier_names(2)
    return Ladder(
        [Tier(name, CacheGroup(model, name)) for name, model in zip(names, (small, large), strict=True)],
        description=f"{small.name} → {large.name}",
    )


def gear_ladder(model: LoadedModel, gears: list[int]) -> Ladder:
    """Gear tiers of one nested-gear model sharing a single cache, prefilled at the top gear."""
    names = local_tier_names(1, gears)
    group = CacheGroup(model, "+".join(names), prefill_gear=gears[-1])
    return Ladder(
        [Tier(name, group, gear=bits) for name, bits in zip(names, gears, strict=True)],
        description=f"{model.name} gears {'/'.join(map(str, gears))}",
    )
