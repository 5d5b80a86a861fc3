"""transformers' generate() with a static KV cache on the GPU, compiled as users compile it: both
backend forms under CUDA graphs (CompileConfig's default mode) replay a tuned kernel at every site
of the decode step `tune-model --decode` captured, with logits and cache matching eager's step
after step; the whole-model check measures that step."""
import logging

import pytest
import torch
from torch import nn

import gpu_cases
from models import llama_lm

SPEC = f"{__file__}:small_llama"
SHAPE = "4,40,12"  # batch, context, new tokens


def small_llama() -> nn.Module:
    """A Llama-style causal LM: GQA 8/2, head dim 64, SiLU-gated MLP, rotary, a 4000-word head."""
    return llama_lm(hidden=512, intermediate=1408, heads=8, kv_heads=2, vocab=4000)


@pytest.fixture
def tuned_db(tmp_path):
    from tritune.tuner.model.subject import subject_tasks

    tasks = subject_tasks(SPEC, (), "fp16", "cuda", decode=SHAPE)
    return gpu_cases.store_defaults(tasks, tmp_path / "t.db"), tasks


@pytest.mark.parametrize("form", ["name", "object"])
def test_generate_replays_tuned_kernels_under_cuda_graphs_and_matches_eager(tuned_db, caplog, form):
    from transformers import CompileConfig

    import tritune
    from tritune.tuner.model.decode import cache_tensors, teacher_forced

    db, tasks = tuned_db
    torch._dynamo.reset()
    torch.manual_seed(0)
    lm = small_llama().cuda().half().eval()
    prompt = torch.randint(0, 4000, (4, 40), device="cuda")
    tokens = torch.randint(0, 4000, (4, 12), device="cuda")
    want, want_cache = teacher_forced(lm, prompt, tokens)
    backend = "tritune" if form == "name" else tritune.compiler(db)
    with tritune.apply_history_best(db), caplog.at_level(logging.WARNING, logger="tritune.compiler"):
        got, cache = teacher_forced(lm, prompt, tokens, CompileConfig(backend=backend))
    assert "no tuned record" not in caplog.text and "goes to the fallback" not in caplog.text
    errors = [float((a.double() - b.double()).norm() / b.double().norm()) for a, b in zip(got, want)]
    assert max(errors) < 2e-2, errors
    upto = 40 + 12 - 1
    for a, b in zip(cache_tensors(cache, upto), cache_tensors(want_cache, upto)):
        assert float((a.double() - b.double()).norm() / b.double().norm()) < 2e-2


def test_torch_compile_by_name_in_the_cuda_graph_mode(tmp_path):
    import tritune

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 32)).cuda().half()
    x = torch.randn(16, 64, device="cuda", dtype=torch.float16)
    db = gpu_cases.store_defaults(tritune.extract_tasks(model, (x,)), tmp_path / "t.db")
    torch._dynamo.reset()
    with torch.no_grad(), tritune.apply_history_best(db):
        compiled = torch.compile(model, backend="tritune", mode="reduce-overhead")
        outs = [compiled(x).clone() for _ in range(4)]
    assert all(torch.allclose(o, model(x), atol=1e-2) for o in outs)


def test_the_check_measures_the_decode_step(tuned_db):
    from tritune.tuner.model.check import check_model

    db, tasks = tuned_db
    results = check_model(SPEC, (), "fp16", db, rounds=3, decode=SHAPE)
    assert [r["mode"] for r in results] == ["default", "reduce-overhead"]
    for r in results:
        assert "error" not in r, r
        assert r["tuned_sites"] == r["sites"] == sum(t.count for t in tasks) and r["rel_error"] < 5e-2


def test_generate_called_again_replays_its_capture_on_the_new_cache(tuned_db, monkeypatch):
    # generate() allocates a new static cache for every call: the graph captured on the first
    # call's cache replays on the next calls' (adopted into the captured memory), not captured again
    from transformers import CompileConfig

    import tritune
    from tritune.kernels.backend import cuda_graphs
    from tritune.tuner.model.decode import cache_tensors, teacher_forced

    captures = []
    capture = cuda_graphs.GraphStep._capture
    monkeypatch.setattr(cuda_graphs.GraphStep, "_capture", lambda self, args: captures.append(1) or capture(self, args))
    db, _ = tuned_db
    torch._dynamo.reset()
    torch.manual_seed(0)
    lm = small_llama().cuda().half().eval()
    config = CompileConfig(backend=tritune.compiler(db))
    for _ in range(3):
        prompt = torch.randint(0, 4000, (4, 40), device="cuda")
        tokens = torch.randint(0, 4000, (4, 12), device="cuda")
        want, want_cache = teacher_forced(lm, prompt, tokens)
        got, cache = teacher_forced(lm, prompt, tokens, config)
        assert _worst(got, want) < 2e-2 and _worst(cache_tensors(cache, 51), cache_tensors(want_cache, 51)) < 2e-2
        del cache, want_cache  # generate() users keep no cache past the call (nor a view of it)
    assert len(captures) == 1


def _worst(outs: list, refs: list) -> float:
    return max(float((a.double() - b.double()).norm() / b.double().norm()) for a, b in zip(outs, refs))
