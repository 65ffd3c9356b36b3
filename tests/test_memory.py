import torch
from torch import nn

from tula.memory import MemoryModel, fit_memory_model, is_out_of_memory, measure_step_peak_bytes
from tula.workloads import SmallCNN


def _step_fn(model, opt, b):
    x, y = torch.randn(b, 1, 8, 8), torch.randint(0, 10, (b,))

    def run():
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return run


def test_memory_model_predicts_measured_peak_of_a_real_model():
    torch.manual_seed(0)
    model = SmallCNN(width=16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _step_fn(model, opt, 4)()  # creates the momentum buffers (lazy optimiser state)
    probe = (16, 32)
    peaks = tuple(measure_step_peak_bytes(_step_fn(model, opt, b), model, opt, torch.device("cpu")) for b in probe)
    mm = fit_memory_model(model, opt, sample_bytes=0, local_batches=probe, peaks=peaks, device=torch.device("cpu"))
    params = sum(p.numel() * 4 for p in model.parameters())
    assert mm.param_bytes == params and mm.grad_bytes == params
    assert mm.optimizer_state_bytes == params  # one momentum buffer per parameter
    assert mm.activation_bytes_per_sample > 0
    for b in (128, 300):
        measured = measure_step_peak_bytes(_step_fn(model, opt, b), model, opt, torch.device("cpu"))
        assert abs(mm.predict_peak_bytes(b) / measured - 1) < 0.03, (b, measured, mm.predict_peak_bytes(b))


def test_max_local_batch_respects_budget_and_margin():
    mm = MemoryModel(param_bytes=1000, grad_bytes=1000, optimizer_state_bytes=1000, buffer_bytes=0,
                     other_static_bytes=0, activation_bytes_per_sample=90, batch_bytes_per_sample=10,
                     probe_local_batches=(1, 2), probe_peak_bytes=(3100, 3200), device="cpu")
    assert mm.predict_peak_bytes(10) == 4000
    assert mm.max_local_batch(None) is None
    assert mm.max_local_batch(13000, safety=0.0) == 100
    assert mm.max_local_batch(13000, safety=0.1) == 87  # floor((11700 - 3000) / 100)
    assert mm.max_local_batch(3050, safety=0.0) == 0
    assert mm.predict_peak_bytes(mm.max_local_batch(50000, 0.2)) <= 0.8 * 50000
    assert MemoryModel.from_dict(mm.to_dict()) == mm


def test_refit_uses_more_points():
    mm = MemoryModel(param_bytes=100, grad_bytes=100, optimizer_state_bytes=0, buffer_bytes=0,
                     other_static_bytes=0, activation_bytes_per_sample=5, batch_bytes_per_sample=5,
                     probe_local_batches=(1, 2), probe_peak_bytes=(300, 320), device="cpu")
    # the true line is 500 + 20 b above the probe's small batches
    r = mm.refit([64, 128, 256], [500 + 20 * 64, 500 + 20 * 128, 500 + 20 * 256])
    assert abs(r.predict_peak_bytes(512) / (500 + 20 * 512) - 1) < 0.05


def test_oom_classification():
    assert is_out_of_memory(RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: "
                                         "can't allocate memory: you tried to allocate 123 bytes."))
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
