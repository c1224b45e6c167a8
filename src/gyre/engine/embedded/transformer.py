"""A decoder-only transformer (Qwen3 / Qwen2 / Llama families) that reads a Hugging Face model directory.

It knows nothing about requests or tokenizers: it maps a flat batch of token ids with positions and KV-cache slots
to hidden states, writing each token's keys and values into a shared slot pool (one slot per token, as in SGLang's
token-granular pool). Attention for decode rows is batched; each prefill segment attends to its own slots.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import safe_open

from gyre.errors import ConfigError

SUPPORTED_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM")


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a model, read from its ``config.json``."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qk_norm: bool
    attention_bias: bool
    eos_token_ids: tuple[int, ...]

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelSpec:
        """Read ``config.json`` (and ``generation_config.json`` for end-of-sequence ids)."""
        path = Path(model_dir) / "config.json"
        try:
            cfg: dict[str, Any] = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{model_dir} is not a model directory: {path.name} is missing") from None
        arch = (cfg.get("architectures") or ["?"])[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ConfigError(
                f"{path}: architecture {arch!r} is not supported; supported: {SUPPORTED_ARCHITECTURES}"
            )
        scaling = cfg.get("rope_scaling") or {}
        if scaling and scaling.get("rope_type", scaling.get("type", "default")) != "default":
            raise ConfigError(f"{path}: rope_scaling {scaling} is not supported by the embedded engine")
        if cfg.get("use_sliding_window") or (arch == "MistralForCausalLM" and cfg.get("sliding_window")):
            raise ConfigError(f"{path}: sliding-window attention is not supported by the embedded engine")
        heads = int(cfg["num_attention_heads"])
        eos = _eos_ids(Path(model_dir), cfg)
        return cls(
            architecture=arch,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(
                cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))
            ),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 32768)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            attention_bias=bool(cfg.get("attention_bias", arch == "Qwen2ForCausalLM")),
            eos_token_ids=eos,
        )


def _eos_ids(model_dir: Path, cfg: dict[str, Any]) -> tuple[int, ...]:
    ids: list[int] = []
    sources = [cfg]
    gen = model_dir / "generation_config.json"
    if gen.exists():
        sources.append(json.loads(gen.read_text()))
    for source in sources:
        value = source.get("eos_token_id")
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, int) and item not in ids:
                ids.append(item)
    return tuple(ids)


class _Layer:
    __slots__ = ("down", "gate_up", "k_norm", "ln1", "ln2", "o", "q_norm", "qkv", "qkv_bias")

    def __init__(self) -> None:
        self.qkv: torch.Tensor
        self.qkv_bias: torch.Tensor | None = None
        self.o: torch.Tensor
        self.q_norm: torch.Tensor | None = None
        self.k_norm: torch.Tensor | None = None
        self.ln1: torch.Tensor
        self.ln2: torch.Tensor
        self.gate_up: torch.Tensor
        self.down: torch.Tensor


@dataclass
class ForwardBatch:
    """One engine step, flattened: decode rows first (those with a lane, then the rest), then prefill segments.

    ``out_slots[i]`` is the KV slot token ``i`` writes. Decode row ``r < num_lane`` has its keys and values in lane
    ``lane_index[r]`` of ``lane_k``/``lane_v`` ([layers, lanes, kv_heads, lane_len, head_dim], see `DecodeLanes`):
    it writes its
    new token at ``positions[r]`` there too and attends to the lane's first ``lane_mask`` positions; ``lane_index``
    is None when the lanes are ``0..num_lane-1`` in order, so attention reads a view. Any other decode row ``r``
    attends to the pool rows ``decode_slots[r - num_lane]`` (masked by ``decode_mask``); prefill segment
    ``(start, length, slots)`` attends causally to ``slots`` (cached prefix followed by its own tokens).
    """

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    out_slots: torch.Tensor  # [T] int64
    num_decode: int
    decode_slots: torch.Tensor | None  # [num_decode, max_len] int64, padded
    decode_mask: torch.Tensor | None  # [num_decode, 1, 1, max_len] bool
    prefills: list[tuple[int, int, torch.Tensor]]
    logit_rows: torch.Tensor  # [R] rows whose next-token logits are needed
    num_lane: int = 0
    lane_index: torch.Tensor | None = None  # [num_lane] int64, None: lanes 0..num_lane-1
    lane_mask: torch.Tensor | None = None  # [num_lane, 1, 1, width] bool
    lane_k: torch.Tensor | None = None
    lane_v: torch.Tensor | None = None


class TransformerLM:
    """Weights plus a forward over a flat batch; KV lives in a pool owned by the caller."""

    def __init__(self, spec: ModelSpec, device: torch.device, dtype: torch.dtype) -> None:
        self.spec = spec
        self.device = device
        self.dtype = dtype
        self.layers: list[_Layer] = []
        self.embed: torch.Tensor | None = None
        self.norm: torch.Tensor
        self.lm_head: torch.Tensor
        self._cos = torch.empty(0)
        self._sin = torch.empty(0)
        self._flat: torch.Tensor | None = None  # every weight is a view of it (None: released)

    @property
    def loaded(self) -> bool:
        """Whether weights are resident (False after a memory release)."""
        return self.embed is not None

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Hugging Face parameter names and shapes this model accepts in a weight update, in the order its weights
        lie in memory: that of the Hugging Face modules (with attention biases after the q, k and v weights, which
        Hugging Face interleaves), so a trainer's flat weight buffer arrives in place (`receive_buffer`)."""
        s = self.spec
        q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (s.vocab_size, s.hidden_size)}
        for i in range(s.num_layers):
            p = f"model.layers.{i}."
            shapes |= {
                p + "self_attn.q_proj.weight": (q, s.hidden_size),
                p + "self_attn.k_proj.weight": (kv, s.hidden_size),
                p + "self_attn.v_proj.weight": (kv, s.hidden_size),
            }
            if s.attention_bias:
                shapes |= {p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,)}
                shapes |= {p + "self_attn.v_proj.bias": (kv,)}
            shapes[p + "self_attn.o_proj.weight"] = (s.hidden_size, q)
            if s.qk_norm:
                shapes |= {
                    p + "self_attn.q_norm.weight": (s.head_dim,),
                    p + "self_attn.k_norm.weight": (s.head_dim,),
                }
            shapes |= {
                p + "mlp.gate_proj.weight": (s.intermediate_size, s.hidden_size),
                p + "mlp.up_proj.weight": (s.intermediate_size, s.hidden_size),
                p + "mlp.down_proj.weight": (s.hidden_size, s.intermediate_size),
                p + "input_layernorm.weight": (s.hidden_size,),
                p + "post_attention_layernorm.weight": (s.hidden_size,),
            }
        shapes["model.norm.weight"] = (s.hidden_size,)
        if not s.tie_word_embeddings:
            shapes["lm_head.weight"] = (s.vocab_size, s.hidden_size)
        return shapes

    def receive_buffer(self, names: list[str], dtype: torch.dtype) -> torch.Tensor | None:
        """The weights' own memory as bytes, when an update of ``names`` (in that order, of ``dtype``) covers it
        exactly: a flattened bucket can then be received in place, with no copy. None otherwise."""
        if self._flat is None or dtype != self.dtype or names != list(self.param_shapes()):
            return None
        return self._flat.view(torch.uint8)

    def load_dir(self, model_dir: str | Path) -> None:
        """Load every ``*.safetensors`` file of a Hugging Face model directory."""
        files = sorted(Path(model_dir).glob("*.safetensors"))
        if not files:
            raise ConfigError(f"{model_dir} holds no *.safetensors weights")
        tensors: dict[str, torch.Tensor] = {}
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                    tensors[name] = f.get_tensor(name)
        self.load_state(tensors)

    def load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        """Install a complete set of Hugging Face-named weights, checking names and shapes."""
        shapes = self.param_shapes()
        missing = [n for n in shapes if n not in tensors]
        if missing:
            raise ConfigError(f"weights are missing {len(missing)} tensors, e.g. {missing[:3]}")
        for name, shape in shapes.items():
            if tuple(tensors[name].shape) != shape:
                raise ConfigError(f"weight {name} has shape {tuple(tensors[name].shape)}, expected {shape}")
        # One buffer in param_shapes order; every weight (and each fused pair or triple) is a view of it.
        flat = torch.empty(
            sum(math.prod(shape) for shape in shapes.values()), device=self.device, dtype=self.dtype
        )
        t: dict[str, torch.Tensor] = {}
        start: dict[str, int] = {}
        at = 0
        for name, shape in shapes.items():
            start[name], t[name] = at, flat[at : at + math.prod(shape)].view(shape)
            t[name].copy_(tensors[name])
            at += math.prod(shape)

        def fused(first: str, last: str) -> torch.Tensor:
            """The rows of ``first`` through ``last``, adjacent in the buffer, as one matrix."""
            return flat[start[first] : start[last] + t[last].numel()].view(-1, t[first].shape[1])

        layers = []
        for i in range(self.spec.num_layers):
            p = f"model.layers.{i}."
            layer = _Layer()
            layer.qkv = fused(p + "self_attn.q_proj.weight", p + "self_attn.v_proj.weight")
            if self.spec.attention_bias:  # the biases follow the three weights, adjacent too
                q_bias, v_bias = p + "self_attn.q_proj.bias", p + "self_attn.v_proj.bias"
                layer.qkv_bias = flat[start[q_bias] : start[v_bias] + t[v_bias].numel()]
            layer.o = t[p + "self_attn.o_proj.weight"]
            if self.spec.qk_norm:
                layer.q_norm = t[p + "self_attn.q_norm.weight"]
                layer.k_norm = t[p + "self_attn.k_norm.weight"]
            layer.ln1 = t[p + "input_layernorm.weight"]
            layer.ln2 = t[p + "post_attention_layernorm.weight"]
            layer.gate_up = fused(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight")
            layer.down = t[p + "mlp.down_proj.weight"]
            layers.append(layer)
        self.layers = layers
        self.embed = t["model.embed_tokens.weight"]
        self.norm = t["model.norm.weight"]
        self.lm_head = self.embed if self.spec.tie_word_embeddings else t["lm_head.weight"]
        self._flat = flat

    def update_tensor(self, name: str, value: torch.Tensor) -> None:
        """Replace one Hugging Face-named weight in place (used by streamed weight updates)."""
        shape = self.param_shapes().get(name)
        if shape is None:
            raise ConfigError(f"unknown weight name {name!r}")
        if tuple(value.shape) != shape:
            raise ConfigError(f"weight {name} has shape {tuple(value.shape)}, expected {shape}")
        value = value.to(self.device, self.dtype)
        s = self.spec
        q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        if name in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"):
            target = {"model.embed_tokens.weight": self.embed, "lm_head.weight": self.lm_head}.get(
                name, self.norm
            )
            assert target is not None
            target.copy_(value)
            return
        layer = self.layers[int(name.split(".")[2])]
        leaf = name.split(".", 3)[3]
        offsets = {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv)}
        inter = s.intermediate_size
        match leaf.split("."):
            case ["self_attn", proj, "weight"] if proj[0] in "qkv" and proj.endswith("_proj"):
                lo, hi = offsets[proj[0]]
                layer.qkv[lo:hi].copy_(value)
            case ["self_attn", proj, "bias"] if layer.qkv_bias is not None:
                lo, hi = offsets[proj[0]]
                layer.qkv_bias[lo:hi].copy_(value)
            case ["self_attn", "o_proj", "weight"]:
                layer.o.copy_(value)
            case ["self_attn", "q_norm", "weight"] if layer.q_norm is not None:
                layer.q_norm.copy_(value)
            case ["self_attn", "k_norm", "weight"] if layer.k_norm is not None:
                layer.k_norm.copy_(value)
            case ["input_layernorm", "weight"]:
                layer.ln1.copy_(value)
            case ["post_attention_layernorm", "weight"]:
                layer.ln2.copy_(value)
            case ["mlp", "gate_proj", "weight"]:
                layer.gate_up[:inter].copy_(value)
            case ["mlp", "up_proj", "weight"]:
                layer.gate_up[inter:].copy_(value)
            case ["mlp", "down_proj", "weight"]:
                layer.down.copy_(value)
            case _:
                raise ConfigError(f"cannot update weight {name!r}")

    def release(self) -> None:
        """Drop the weights (memory release); ``load_*`` brings them back."""
        self.layers, self.embed, self._flat = [], None, None
        self.norm = self.lm_head = torch.empty(0)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        need = int(positions.max()) + 1
        if self._cos.shape[0] < need:
            size = max(need, 2 * self._cos.shape[0], 4096)
            d = self.spec.head_dim
            inv_freq = 1.0 / (self.spec.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
            freqs = torch.outer(torch.arange(size, dtype=torch.float32), inv_freq)
            emb = torch.cat([freqs, freqs], dim=-1)
            self._cos, self._sin = emb.cos().to(self.device), emb.sin().to(self.device)
        return self._cos[positions].to(self.dtype), self._sin[positions].to(self.dtype)

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # one fused op; the same arithmetic as below
            return F.rms_norm(x, weight.shape, weight, self.spec.rms_norm_eps)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.spec.rms_norm_eps)
        return weight * xf.to(self.dtype)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, k_pool: torch.Tensor, v_pool: torch.Tensor) -> torch.Tensor:
        """Run the batch, writing K/V into the pools ([layers, slots, kv_heads * head_dim]); return logits [R, V]."""
        assert self.embed is not None, "weights are released"
        s = self.spec
        n_tok = batch.input_ids.shape[0]
        nh, kvh, hd = s.num_heads, s.num_kv_heads, s.head_dim
        group = nh // kvh
        cos, sin = self._rope(batch.positions)
        cos, sin = cos[:, None, :], sin[:, None, :]
        x = self.embed[batch.input_ids]
        nd, nl, lane_idx = batch.num_decode, batch.num_lane, batch.lane_index
        if nl:  # where each lane row's new key (one row per kv head) goes in its layer's flattened lanes
            assert batch.lane_k is not None
            lane_rows = lane_idx if lane_idx is not None else torch.arange(nl, device=x.device)
            heads = lane_rows[:, None] * kvh + torch.arange(kvh, device=x.device)[None, :]
            lane_at = (heads * batch.lane_k.shape[3] + batch.positions[:nl, None]).reshape(-1)
        for li, layer in enumerate(self.layers):
            h = self._rms(x, layer.ln1)
            qkv = F.linear(h, layer.qkv, layer.qkv_bias)
            q = qkv[:, : nh * hd].view(n_tok, nh, hd)
            k = qkv[:, nh * hd : (nh + kvh) * hd].view(n_tok, kvh, hd)
            v = qkv[:, (nh + kvh) * hd :].view(n_tok, kvh, hd)
            if layer.q_norm is not None and layer.k_norm is not None:
                q, k = self._rms(q, layer.q_norm), self._rms(k, layer.k_norm)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            kp, vp = (
                k_pool[li],
                v_pool[li],
            )  # [slots, kv_heads * head_dim]: 2-D rows gather several times faster
            kp.index_copy_(0, batch.out_slots, k.reshape(n_tok, kvh * hd))
            vp.index_copy_(0, batch.out_slots, v.reshape(n_tok, kvh * hd))
            attn = torch.empty(n_tok, nh * hd, dtype=x.dtype, device=x.device)
            if nl:  # one batched attention over the lanes, padded to the longest and masked
                assert batch.lane_k is not None and batch.lane_v is not None and batch.lane_mask is not None
                kl, vl = batch.lane_k[li], batch.lane_v[li]  # [lanes, kvh, lane_len, hd]
                width = batch.lane_mask.shape[-1]
                kl.view(-1, hd).index_copy_(0, lane_at, k[:nl].reshape(nl * kvh, hd))
                vl.view(-1, hd).index_copy_(0, lane_at, v[:nl].reshape(nl * kvh, hd))
                if lane_idx is None:  # a strided view: nothing is copied
                    kd, vd = kl[:nl, :, :width], vl[:nl, :, :width]  # [B, kvh, L, hd]
                else:
                    kd = kl.index_select(0, lane_idx)[:, :, :width]
                    vd = vl.index_select(0, lane_idx)[:, :, :width]
                qd = q[:nl].view(nl, kvh, group, hd)  # query heads grouped by the kv head they share
                od = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=batch.lane_mask)
                attn[:nl] = od.reshape(nl, nh * hd)
            if nd > nl:
                assert batch.decode_slots is not None
                ng = nd - nl
                flat = batch.decode_slots.view(-1)  # index_select: much faster than fancy indexing
                kd = kp.index_select(0, flat).view(ng, -1, kvh, hd).transpose(1, 2)  # [B, kvh, L, hd]
                vd = vp.index_select(0, flat).view(ng, -1, kvh, hd).transpose(1, 2)
                qd = q[nl:nd].view(ng, kvh, group, hd)  # query heads grouped by the kv head they share
                od = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=batch.decode_mask)
                attn[nl:nd] = od.reshape(ng, nh * hd)
            for start, length, slots in batch.prefills:
                ks = (
                    kp.index_select(0, slots).view(-1, kvh, hd).transpose(0, 1).unsqueeze(0)
                )  # [1, kvh, L, hd]
                vs = vp.index_select(0, slots).view(-1, kvh, hd).transpose(0, 1).unsqueeze(0)
                qs = q[start : start + length].view(length, kvh, group, hd).permute(1, 2, 0, 3)
                qs = qs.reshape(1, kvh, group * length, hd)
                total = slots.shape[0]
                rows = torch.arange(total - length, total, device=x.device)
                mask = torch.arange(total, device=x.device)[None, :] <= rows[:, None]  # [length, total]
                os_ = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask.repeat(group, 1))
                attn[start : start + length] = (
                    os_.view(kvh, group, length, hd).permute(2, 0, 1, 3).reshape(length, -1)
                )
            x = x + F.linear(attn, layer.o)
            h = self._rms(x, layer.ln2)
            gate, up = F.linear(h, layer.gate_up).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer.down)
        h = self._rms(x[batch.logit_rows], self.norm)
        return F.linear(h, self.lm_head).float()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)
