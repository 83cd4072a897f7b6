"""`Policy`: a LoRA policy on any Hugging Face causal LM, with batched sampling, per-token log-probs, KL to the
reference (the same model with its adapters off, so no second copy) and value heads for PPO."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pad_sequence

from collabalign.config import LoRASection
from collabalign.data.errors import PromptError
from collabalign.data.limits import cut_texts, max_chars
from collabalign.lora.inject import inject_lora, lora_parameters
from collabalign.lora.targets import default_targets
from collabalign.models.backbones import Backbone
from collabalign.models.pooled import layer_stack, top_block_targets
from collabalign.policy.rollout import Rollout
from collabalign.policy.sampling import sample_next


def shared_reads(prompts: Sequence[str]) -> tuple[np.ndarray, np.ndarray] | None:
    """For a batch that repeats a prompt: the first row of each distinct prompt, and each row's index among those;
    None when every prompt is distinct."""
    first, row_of = np.unique(np.array(prompts, dtype=object), return_index=True, return_inverse=True)[1:]
    return None if len(first) == len(prompts) else (first, row_of.reshape(-1))


def positions(attention_mask: Tensor) -> Tensor:
    """Position ids that start at 0 on each row's first real token, so left padding changes nothing."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


class Policy(nn.Module):
    """Causal LM + LoRA on `targets` (base frozen) + `objectives` linear value heads on the detached last hidden state.

    Starts in eval mode (LoRA dropout off, as TRL runs PPO, RLOO and DPO, so PPO ratios start at exactly 1); call
    `.train()` to turn dropout on, e.g. for SFT.
    """

    def __init__(self, backbone: Backbone, targets: Sequence[str] = ("q_proj", "k_proj", "v_proj", "o_proj"),
                 rank: int = 16, alpha: float = 32.0, dropout: float = 0.05, objectives: int = 1,
                 generator: torch.Generator | None = None):
        super().__init__()
        if not backbone.causal:
            raise ValueError("Policy needs a causal LM backbone")
        self.model = backbone.model
        self.tokenizer = backbone.tokenizer
        self.layers = list(inject_lora(self.model, list(targets), rank, alpha, dropout=dropout,
                                       generator=generator).values())
        device = self.model.get_input_embeddings().weight.device
        self.value_head = nn.Linear(self.model.config.hidden_size, objectives, device=device)
        self.reset_value_heads()
        configured = self.model.generation_config.eos_token_id
        eos = {self.tokenizer.eos_token_id, *(configured if isinstance(configured, list) else [configured])} - {None}
        if not eos:
            raise ValueError("neither the tokenizer nor the generation config names an EOS token to stop at")
        self.eos_id = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else min(eos)
        self.register_buffer("eos_ids", torch.tensor(sorted(eos), device=device), persistent=False)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_id
        self.reference_state: dict[str, np.ndarray] | None = None
        self.eval()

    @property
    def device(self) -> torch.device:
        """Where the model and value heads live (encoded prompts are put there)."""
        return self.value_head.weight.device

    @property
    def objectives(self) -> int:
        """M, the number of value heads (one per reward objective)."""
        return self.value_head.out_features

    def adapter_params(self) -> list[Tensor]:
        """LoRA A/B in model order: what the actor optimiser trains and what gets averaged."""
        return list(lora_parameters(self.model).values())

    def value_params(self) -> list[Tensor]:
        """The value heads' weight and bias: what the critic optimiser trains (kept local, never averaged)."""
        return list(self.value_head.parameters())

    def reset_adapters(self, generator: torch.Generator | None = None) -> None:
        """Fresh LoRA factors (A drawn from `generator`, B = 0), so the policy equals the reference again."""
        for layer in self.layers:
            layer.reset_parameters(generator)

    def reset_value_heads(self) -> None:
        """Value heads back to zero: deterministic and independent of any RNG."""
        with torch.no_grad():
            self.value_head.weight.zero_()
            self.value_head.bias.zero_()

    def value_state(self) -> dict[str, np.ndarray]:
        """{'value.weight', 'value.bias'}: a client's private critic, as named float32 arrays."""
        return {f"value.{n}": p.detach().float().cpu().numpy().copy() for n, p in self.value_head.named_parameters()}

    def load_value_state(self, state: dict[str, np.ndarray]) -> None:
        """Reads the 'value.*' arrays of `state` (other names are ignored: it may be a client's whole state)."""
        with torch.no_grad():
            for name, p in self.value_head.named_parameters():
                p.copy_(torch.as_tensor(np.asarray(state[f"value.{name}"])))

    def adapter_state(self) -> dict[str, np.ndarray]:
        """{'<layer>.A' / '.B': float32 copy}, the arrays a federated method sends and averages."""
        return {n: p.detach().float().cpu().numpy().copy() for n, p in lora_parameters(self.model).items()}

    def load_adapter_state(self, state: dict[str, np.ndarray]) -> None:
        """Copies an `adapter_state` back in; names and shapes must match exactly."""
        params = lora_parameters(self.model)
        if set(state) != set(params):
            raise ValueError(f"adapter state names differ: missing {sorted(set(params) - set(state))[:4]}, "
                             f"unexpected {sorted(set(state) - set(params))[:4]}")
        with torch.no_grad():
            for name, p in params.items():
                value = torch.as_tensor(np.asarray(state[name]))
                if value.shape != p.shape:
                    raise ValueError(f"adapter state {name}: shape {tuple(value.shape)}, expected {tuple(p.shape)}")
                p.copy_(value)

    def set_reference(self, state: dict[str, np.ndarray] | None) -> None:
        """The reference policy of `reference()`: None (the default) is the adapters-off base model; an adapter state
        (e.g. an SFT policy's, as PPO and DPO use in the meta-reward paper) is swapped in instead."""
        self.reference_state = None if state is None else {k: np.array(v, copy=True) for k, v in state.items()}

    @contextmanager
    def reference(self) -> Iterator[None]:
        """Within the block the policy is its reference: every adapter off, or the `set_reference` state loaded."""
        if self.reference_state is not None:
            current = self.adapter_state()
            self.load_adapter_state(self.reference_state)
            try:
                yield
            finally:
                self.load_adapter_state(current)
            return
        before = [layer.enabled for layer in self.layers]
        for layer in self.layers:
            layer.enabled = False
        try:
            yield
        finally:
            for layer, enabled in zip(self.layers, before, strict=True):
                layer.enabled = enabled

    def encode(self, prompts: list[str], chat: bool = True, max_prompt_tokens: int = 256) -> tuple[Tensor, Tensor]:
        """Prompts -> left-padded (input_ids, attention_mask) (B, P). With `chat` and a chat template each prompt is
        a user turn plus the generation prompt. A prompt over `max_prompt_tokens` is a PromptError, never truncated
        (one over what that many tokens can hold is refused before tokenising)."""
        if not prompts:
            raise PromptError("no prompts to encode")
        for i, prompt in enumerate(prompts):
            if len(prompt) > max_chars(max_prompt_tokens):
                raise PromptError(f"prompt {i} is {len(prompt):,} characters long, more than "
                                  f"max_prompt_tokens={max_prompt_tokens} tokens hold; shorten it")
        templated = bool(chat and getattr(self.tokenizer, "chat_template", None))
        texts = [self.tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                    tokenize=False) for p in prompts] if templated else list(prompts)
        rows = self.tokenizer(texts, add_special_tokens=not templated)["input_ids"]
        for i, row in enumerate(rows):
            if len(row) > max_prompt_tokens:
                raise PromptError(f"prompt {i} is {len(row)} tokens long, over max_prompt_tokens="
                                  f"{max_prompt_tokens}; shorten it")
            if not row:
                raise PromptError(f"prompt {i} encodes to no tokens")
        ids = pad_sequence([torch.tensor(r, dtype=torch.long) for r in rows], batch_first=True,
                           padding_value=self.pad_id, padding_side="left")
        lengths = torch.tensor([len(r) for r in rows])
        mask = (torch.arange(ids.shape[1])[None, :] >= ids.shape[1] - lengths[:, None]).long()
        return ids.to(self.device), mask.to(self.device)

    @torch.no_grad()
    def generate(self, prompts: list[str], max_new_tokens: int, *, generator: torch.Generator,
                 temperature: float | Tensor = 1.0, top_p: float = 1.0, chat: bool = True,
                 max_prompt_tokens: int = 256) -> Rollout:
        """Batched sampling with a KV cache, deterministic under `generator`; each row stops at EOS (kept) and is
        padded after. temperature 0 is greedy; a (B,) tensor of positive temperatures gives each row its own. A prompt
        repeated in the batch (several samples per prompt) is read once: its cache is copied to each of its rows."""
        if isinstance(temperature, Tensor):
            bad_t = temperature.shape != (len(prompts),) or not bool((temperature > 0).all())
        else:
            bad_t = temperature < 0
        if max_new_tokens < 1 or bad_t or not 0 < top_p <= 1:
            raise ValueError(f"need max_new_tokens >= 1, temperature >= 0 (or one > 0 per prompt), 0 < top_p <= 1; "
                             f"got {max_new_tokens}, {temperature}, {top_p}")
        prompt_ids, prompt_mask = self.encode(prompts, chat, max_prompt_tokens)
        mask, pos = prompt_mask, positions(prompt_mask)
        shared = shared_reads(prompts)
        read = slice(None) if shared is None else torch.as_tensor(shared[0], device=self.device)
        out = self.model(input_ids=prompt_ids[read], attention_mask=mask[read], position_ids=pos[read],
                         use_cache=True, logits_to_keep=1)
        logits = out.logits[:, -1]
        if shared is not None:  # each row takes its prompt's cache and next-token logits
            rows = torch.as_tensor(shared[1], device=self.device)
            out.past_key_values.batch_select_indices(rows)
            logits = logits[rows]
        alive = torch.ones(len(prompts), dtype=torch.bool, device=self.device)
        tokens, emitted = [], []
        for step in range(max_new_tokens):
            token = sample_next(logits, temperature, top_p, generator).to(self.device)
            token = token.masked_fill(~alive, self.pad_id)
            tokens.append(token)
            emitted.append(alive)
            alive = alive & ~torch.isin(token, self.eos_ids)
            if step + 1 == max_new_tokens or not alive.any():
                break
            mask = torch.cat([mask, emitted[-1][:, None].long()], 1)
            pos = pos[:, -1:] + 1
            out = self.model(input_ids=token[:, None], attention_mask=mask, position_ids=pos,
                             past_key_values=out.past_key_values, use_cache=True)
            logits = out.logits[:, -1]
        response, response_mask = torch.stack(tokens, 1), torch.stack(emitted, 1)
        texts = self.tokenizer.batch_decode([r[m].tolist() for r, m in zip(response, response_mask, strict=True)],
                                            skip_special_tokens=True)
        return Rollout.build(prompts, prompt_ids, prompt_mask, response, response_mask, texts)

    def rollout(self, prompts: list[str], responses: list[str], chat: bool = True, eos: bool = True,
                max_prompt_tokens: int = 256, max_response_tokens: int | None = None) -> Rollout:
        """Given responses tokenised after their prompts (for DPO, MLE, scoring); `eos` ends each with EOS, as a
        finished generation does. With `max_response_tokens` a longer response is cut there and gets no EOS (it did
        not finish)."""
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
        prompt_ids, prompt_mask = self.encode(prompts, chat, max_prompt_tokens)
        if max_response_tokens:
            responses = cut_texts(responses, max_response_tokens, keep="start")
        rows = self.tokenizer(list(responses), add_special_tokens=False)["input_ids"]
        cap = max_response_tokens or 10**9
        rows = [r + [self.eos_id] if eos else r for r in rows]
        rows = [torch.tensor(r if len(r) <= cap else r[:cap], dtype=torch.long) for r in rows]
        lengths = torch.tensor([len(r) for r in rows])
        ids = pad_sequence(rows, batch_first=True, padding_value=self.pad_id)
        mask = torch.arange(ids.shape[1])[None, :] < lengths[:, None]
        device = prompt_ids.device
        return Rollout.build(prompts, prompt_ids, prompt_mask, ids.to(device), mask.to(device), responses)

    @property
    def head_only(self) -> bool:
        """Whether the LM head is the only adapted layer (then the trunk is frozen and its states can be cached)."""
        return len(self.layers) == 1 and self.layers[0] is self.model.get_output_embeddings()

    @torch.no_grad()
    def trunk_states(self, rollout: Rollout) -> Tensor:
        """The last hidden states (B, T, H) that predict each response token (the LM head's input), no grad."""
        p = rollout.prompt_len
        out = self.model(input_ids=rollout.input_ids, attention_mask=rollout.attention_mask,
                         position_ids=positions(rollout.attention_mask), use_cache=False, logits_to_keep=1,
                         output_hidden_states=True)
        return out.hidden_states[-1][:, p - 1:-1]

    def with_trunk(self, rollout: Rollout) -> Rollout:
        """The rollout with its trunk states cached, so later passes (PPO epochs, DPO, MLE) cost only the LM head.
        Only valid while the head is the sole adapted layer."""
        if not self.head_only:
            raise ValueError("trunk states can be cached only when the LM head is the only adapted layer "
                             "(build the policy with targets=('lm_head',))")
        return replace(rollout, trunk=self.trunk_states(rollout))

    def _forward(self, rollout: Rollout, values: bool) -> tuple[Tensor, Tensor | None]:
        """One pass over the rollout: response log-probs (B, T), zero where masked, and optionally values (B, T, M),
        V[:, t] being the value of the state before response token t. With cached trunk states only the head runs."""
        p, t = rollout.prompt_len, rollout.input_ids.shape[1] - rollout.prompt_len
        if rollout.trunk is not None:
            hidden = rollout.trunk
            logits = self.model.get_output_embeddings()(hidden).float()
        else:
            out = self.model(input_ids=rollout.input_ids, attention_mask=rollout.attention_mask,
                             position_ids=positions(rollout.attention_mask), use_cache=False, logits_to_keep=t + 1,
                             output_hidden_states=values)
            logits = out.logits[:, :-1].float()
            hidden = out.hidden_states[-1][:, p - 1:-1] if values else None
        targets = rollout.input_ids[:, p:]
        logprobs = logits.gather(-1, targets[..., None]).squeeze(-1) - logits.logsumexp(-1)
        logprobs = logprobs.masked_fill(~rollout.mask, 0.0)
        if not values:
            return logprobs, None
        return logprobs, self.value_head(hidden.detach().float())

    def forward(self, rollout: Rollout) -> tuple[Tensor, Tensor]:
        """Response log-probs (B, T) and values (B, T, M) from the same forward (what PPO needs)."""
        return self._forward(rollout, values=True)

    def token_logprobs(self, rollout: Rollout, reference: bool = False) -> Tensor:
        """log pi(y_t | x, y_<t) for each response token (B, T), zeros where masked; the reference's under no_grad."""
        if not reference:
            return self._forward(rollout, values=False)[0]
        with self.reference(), torch.no_grad():
            return self._forward(rollout, values=False)[0]

    @torch.no_grad()
    def kl(self, rollout: Rollout) -> tuple[Tensor, Tensor]:
        """Sample-based KL to the reference, log pi - log pi_ref: per token (B, T) and summed per sequence (B,)."""
        per_token = self.token_logprobs(rollout) - self.token_logprobs(rollout, reference=True)
        return per_token, per_token.sum(1)


def lora_targets(backbone: Backbone, lora: LoRASection) -> list[str]:
    """The architecture's default (or configured) targets, in the top `lora.blocks` blocks when set."""
    names = default_targets(backbone.model, lora.targets)
    if lora.blocks is None:
        return names
    return top_block_targets(backbone.model, min(lora.blocks, len(layer_stack(backbone.model)[1])), names)
