import torch
from torch import nn

from tula.memory import (MemoryModel, fit_memory_model, is_out_of_memory, measure_phase_peaks, measure_step_peak_bytes,
                         probe_memory_model)
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


def test_probe_separates_the_optimiser_step_from_the_activations():
    """resnet18 on 32x32 images: at local batches 16 and 32 the whole step's peak can sit in
    the optimiser update (momentum SGD over 11 M parameters; with 2 threads it does), so a
    line through whole-step peaks there can be nearly flat.  The phase-separated probe fits
    the line to the forward/backward peaks and keeps the update's peak as a floor."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    cpu = torch.device("cpu")

    def phases(b):
        x, y = torch.randn(b, 3, 32, 32), torch.randint(0, 10, (b,))

        def update():
            opt.step()
            opt.zero_grad(set_to_none=True)

        return (lambda: nn.functional.cross_entropy(model(x), y).backward()), update

    fb, up = phases(8)
    fb()
    up()  # creates the momentum buffers
    probe = (16, 32)
    measured = [measure_phase_peaks(*phases(b), model, opt, cpu) for b in probe]
    mm = fit_memory_model(model, opt, 0, probe, tuple(m[0] for m in measured), cpu,
                          update_peak_bytes=max(m[1] for m in measured))
    whole = [measure_step_peak_bytes(_chain(*phases(b)), model, opt, cpu) for b in (*probe, 192)]
    assert mm.update_peak_bytes >= 3 * mm.param_bytes  # parameters, gradients, momentum
    assert mm.predict_peak_bytes(16) == max(mm.update_peak_bytes, mm.static_bytes + 16 * mm.bytes_per_sample)
    assert abs(mm.predict_peak_bytes(192) / whole[2] - 1) < 0.08, (mm.predict_peak_bytes(192), whole[2])


def test_probing_doubles_the_batch_until_the_activations_show():
    """A step whose peak is a batch-independent 1000 bytes until the activations (10 bytes
    per sample over 200) exceed it: the probes at 16 and 32 see a flat peak, so probing
    doubles on until the peak grows, takes one probe more, fits the line through the last
    two and keeps 1000 as the floor."""
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []

    def measure(b):
        seen.append(b)
        return max(1000, 200 + 10 * b), 900

    mm = probe_memory_model(measure, model, opt, 0, (16, 32), torch.device("cpu"), max_batch=10_000)
    assert seen == [16, 32, 64, 128, 256]
    assert mm.probe_local_batches == (128, 256) and mm.update_peak_bytes == 1000
    assert [mm.predict_peak_bytes(b) for b in (16, 128, 1000)] == [1000, 1480, 10200]
    # a peak that grows from the start needs no extra probe; max_batch bounds the doubling
    seen.clear()
    probe_memory_model(lambda b: (seen.append(b) or (200 + 10 * b, 0)), model, opt, 0, (16, 32), torch.device("cpu"),
                       max_batch=10_000)
    assert seen == [16, 32]
    seen.clear()
    probe_memory_model(measure, model, opt, 0, (16, 32), torch.device("cpu"), max_batch=64)
    assert seen == [16, 32, 64]


def _chain(first, second):
    def run():
        first()
        second()

    return run


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
    floored = MemoryModel.from_dict({**mm.to_dict(), "update_peak_bytes": 5000})
    assert floored.predict_peak_bytes(10) == 5000 and floored.predict_peak_bytes(30) == 6000
    assert floored.max_local_batch(4900, safety=0.0) == 0  # the optimiser step alone does not fit
    old_record = {k: v for k, v in mm.to_dict().items() if k != "update_peak_bytes"}
    assert MemoryModel.from_dict(old_record).update_peak_bytes == 0  # models saved before the field


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
