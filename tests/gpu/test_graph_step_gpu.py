"""The backend's CUDA-graph step on the GPU: a step's outputs are the graph's own memory, one held
past the next call raises (naming the fix) instead of reading the next step's values, and a clone
taken in time keeps them."""
import pytest
import torch

import gpu_cases


def test_outputs_held_past_the_next_call_raise_and_clones_keep_them(tmp_path):
    import tritune

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.ReLU(), torch.nn.Linear(48, 32)).cuda().half()
    x, y = (torch.randn(16, 64, device="cuda", dtype=torch.float16) for _ in range(2))
    db = gpu_cases.store_defaults(tritune.extract_tasks(model, (x,)), tmp_path / "t.db")
    torch._dynamo.reset()
    backend = tritune.compiler(db, mode="reduce-overhead")
    with torch.no_grad():
        compiled = torch.compile(model, backend=backend, fullgraph=True)
        for _ in range(3):  # warm-up, capture
            compiled(x)
        first = compiled(x)
        where, kept = first.data_ptr(), first.clone()
        second = compiled(y)
        torch.cuda.synchronize()
        want_x, want_y = model(x), model(y)
    assert any(kind == "tuned" for _, kind in backend.sites)
    assert second.data_ptr() == where  # handed out where the graph wrote it: no copy
    with pytest.raises(RuntimeError, match="clone the outputs"):
        first.sum()
    assert torch.allclose(kept, want_x, atol=1e-2) and torch.allclose(second, want_y, atol=1e-2)


def test_a_step_reads_weights_in_place_and_captures_on_weights_elsewhere():
    from tritune.kernels.frontend.graphs import GraphStep

    def w_new():
        return torch.nn.Parameter(torch.randn(64, 32, device="cuda"), requires_grad=False)

    w, x = w_new(), torch.randn(16, 64, device="cuda")
    step = GraphStep(lambda w, x: [x @ w + 1.0], [w, x])
    for _ in range(4):
        x = torch.randn(16, 64, device="cuda")
        assert torch.allclose(step(w, x)[0], x @ w + 1.0, atol=1e-3)
    assert len(step.captures) == 1
    with torch.no_grad():
        w.mul_(2.0)  # in place: read where it is, no new capture
    assert torch.allclose(step(w, x)[0], x @ w + 1.0, atol=1e-3) and len(step.captures) == 1
    moved = w_new()
    assert torch.allclose(step(moved, x)[0], x @ moved + 1.0, atol=1e-3) and len(step.captures) == 2
