"""The decode step that transformers' `generate()` compiles, with a static KV cache: what
`tune-cli tune-model --decode` tunes, its check measures and the benchmarks time.

`model.generate(prompt, max_new_tokens=N, cache_implementation="static", compile_config=...)`
fills the cache with the prompt eagerly, then runs every further token through
`torch.compile(model.__call__, **compile_config)`. `capture` runs generate itself up to that first
compiled call and keeps what it passes (the new tokens, their positions, the mask over the cache,
the cache object), so whatever the installed transformers passes is what is tuned and timed; the
cache is as long as generate makes it for that prompt and N.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tritune.errors import first_line
from tritune.tuner.model.load import ModelError, build, load_factory

NEW_TOKENS = 256  # generate()'s max_new_tokens where the user names none: with the prompt, it sizes the cache


@dataclass(frozen=True)
class DecodeShape:
    """`batch` sequences whose cache holds `context` tokens (the prompt) as the step runs, in a
    generate() call asked for `new_tokens` more (with the prompt, what sizes the static cache)."""

    batch: int
    context: int
    new_tokens: int = NEW_TOKENS

    @classmethod
    def parse(cls, text: str) -> "DecodeShape":
        """'BATCH,CONTEXT[,NEW_TOKENS]', e.g. '16,1024' or '1,4096,128'."""
        try:
            sizes = [int(t) for t in text.replace("x", ",").split(",")]
        except ValueError:
            sizes = []
        if len(sizes) not in (2, 3) or min(sizes) < 1 or (len(sizes) == 3 and sizes[2] < 2):
            raise ModelError(f"bad --decode {text!r}: expected BATCH,CONTEXT[,NEW_TOKENS] (positive sizes, "
                              "at least 2 new tokens: the first comes from the prompt's pass)")
        if sizes[0] * sizes[1] > 1 << 24:
            raise ModelError(f"bad --decode {text!r}: {sizes[0]} x {sizes[1]} prompt tokens is more than a decode "
                              "step's cache is sized for here (at most 16M tokens in all)")
        return cls(*sizes)

    def __str__(self) -> str:
        return f"{self.batch},{self.context},{self.new_tokens}"


class DecodeStep:
    """One decode step as generate() runs it, `model.__call__(**kwargs)`, repeatable: `call`
    restores the cache's length counters before each run (a static cache layer counts the tokens
    written, in place, on every call), so every run writes the same position and reads the same
    keys."""

    def __init__(self, model: Any, kwargs: dict) -> None:
        import torch

        self.model, self.kwargs = model, kwargs
        self.cache = next((v for v in kwargs.values() if hasattr(v, "layers")), None)
        layers = getattr(self.cache, "layers", ())
        self._counters = [t for layer in layers for t in vars(layer).values()
                          if isinstance(t, torch.Tensor) and t.dim() == 0 and not t.is_floating_point()]
        self._saved = [t.clone() for t in self._counters]

    @property
    def cache_len(self) -> int:
        """Keys the static cache holds (what the attention reads)."""
        return int(self.cache.layers[0].max_cache_len) if self.cache is not None else 0

    def reset(self) -> None:
        """The cache's length counters back to what they were when the step was captured."""
        import torch

        if self._counters:
            torch._foreach_copy_(self._counters, self._saved)

    def call(self, fn: Callable[..., Any], cuda_graphs: bool = False) -> Callable[[], Any]:
        """One run of the step through `fn` (the model's `__call__`, compiled or not); under CUDA
        graphs a new step begins first (a replay may overwrite the last step's output)."""
        import torch

        def run() -> Any:
            self.reset()
            if cuda_graphs:
                torch.compiler.cudagraph_mark_step_begin()
            return fn(**self.kwargs)
        return run


class _Captured(Exception):
    """Raised where generate() calls its compiled forward for the first decode step."""


def causal_lm(model: Any) -> Any:
    """The model that has `generate` (the zoo's wrappers hold it as `.model`)."""
    for m in (model, getattr(model, "model", None)):
        if m is not None and callable(getattr(m, "generate", None)) and hasattr(m, "get_compiled_call"):
            return m
    raise ModelError(f"--decode needs a transformers causal LM (a model with generate()); the factory "
                      f"returned a {type(model).__name__}")


def capture(lm: Any, shape: DecodeShape, prompt: Any = None) -> DecodeStep:
    """The first decode step of `lm.generate(prompt, max_new_tokens=shape.new_tokens, greedy, static
    cache, compiled)`. `prompt`: token ids [batch, context] (None: one token per sequence and more
    new tokens, the same cache length: the step's graph is the same, what the cache holds is not)."""
    import torch
    from transformers import CompileConfig

    device = next(lm.parameters()).device
    new = shape.new_tokens
    if prompt is None:
        prompt, new = torch.zeros(shape.batch, 1, dtype=torch.long, device=device), shape.context + new - 1
    seen: dict = {}

    def first_step(**kwargs: Any) -> Any:
        seen.update(kwargs)
        raise _Captured

    config = CompileConfig(fullgraph=True)
    config._compile_all_devices = True  # generate compiles on CUDA only unless told
    lm.get_compiled_call = lambda compile_config: first_step
    try:
        static_generate(lm, prompt, new, config)
    except _Captured:
        pass
    finally:
        del lm.get_compiled_call
    if not seen:
        raise ModelError(f"generate() on {type(lm).__name__} ran no compiled decode step (is its cache compileable?)")
    return DecodeStep(lm, seen)


def decode_step(spec: str, shape: DecodeShape, dtype: str, device: str, weights: str = "random") -> DecodeStep:
    """The decode step of the causal LM that the factory `spec` builds: with seeded random weights,
    after a random prompt of `shape.context` tokens (`weights="random"`), or uninitialised and
    after one token (`"empty"`: the same graph, for capturing its workloads)."""
    model, _ = build(load_factory(spec), [], dtype, device, weights)
    lm = causal_lm(model)
    try:
        return capture(lm, shape, random_prompt(lm, shape) if weights == "random" else None)
    except ModelError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's model inside transformers' generate()
        raise ModelError(f"generate() with a static cache failed on the model: {first_line(exc)}") from None


def static_generate(lm: Any, prompt: Any, new: int, compile_config: Any = None, **options: Any) -> Any:
    """`lm.generate()` as the decode step is tuned and timed: `new` tokens after `prompt` (every
    token attended to), exactly (`min_new_tokens`), greedy, with a static cache, compiled by
    `compile_config`; `options` go to generate() too."""
    import torch

    with torch.no_grad():
        return lm.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, cache_implementation="static", compile_config=compile_config,
                           pad_token_id=0, **options)


def random_prompt(lm: Any, shape: DecodeShape, seed: int = 0) -> Any:
    """Seeded random token ids [batch, context] on the model's device."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, lm.config.vocab_size, (shape.batch, shape.context), generator=g)
    return ids.to(next(lm.parameters()).device)


def cache_bytes(lm: Any, shape: DecodeShape) -> int:
    """Bytes of keys and values a decode step must read at `shape.context` tokens, every layer's,
    each once (the part of a decode step's floor that grows with the context)."""
    config = lm.config.get_text_config() if hasattr(lm.config, "get_text_config") else lm.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    elem = next(lm.parameters()).element_size()
    return config.num_hidden_layers * 2 * shape.batch * kv_heads * shape.context * head_dim * elem


def teacher_forced(lm: Any, prompt: Any, tokens: Any, compile_config: Any = None) -> tuple[list, Any]:
    """generate() over `prompt` with a static cache, each new token forced to the next column of
    `tokens` [batch, steps] whatever the model predicts (so two compiled forms of one model see the
    same inputs step after step); compiled by `compile_config` (None: eager). Each step's logits
    (as the model output them, before the forcing) and the cache after the last step."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    class Forced(LogitsProcessor):
        def __call__(self, input_ids: Any, scores: Any) -> Any:
            step = input_ids.shape[1] - prompt.shape[1]
            return torch.full_like(scores, -float("inf")).scatter_(1, tokens[:, step:step + 1], 0.0)

    out = static_generate(lm, prompt, tokens.shape[1], compile_config, disable_compile=compile_config is None,
                          logits_processor=LogitsProcessorList([Forced()]), output_logits=True,
                          return_dict_in_generate=True)
    if not torch.equal(out.sequences[:, prompt.shape[1]:], tokens):
        raise RuntimeError("generate() did not take the forced tokens")
    cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
    return [t.clone() for t in out.logits], cache


def cache_tensors(cache: Any, upto: int) -> list:
    """Every layer's keys and values of a static cache, up to position `upto`."""
    return [t[:, :, :upto] for layer in cache.layers for t in (layer.keys, layer.values)]
