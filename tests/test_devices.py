"""specviz.backends.devices: ggml's device registry as the installed llama-cpp-python build sees it."""

from __future__ import annotations

from specviz.backends.devices import DEVICE_KINDS, backend_names, devices, gpu_devices


def test_the_cpu_device_is_always_listed_with_its_memory():
    ds = devices()
    cpu = [d for d in ds if d.backend == "CPU"]
    assert len(cpu) == 1 and cpu[0].kind == "cpu" and cpu[0].name == "CPU"
    assert cpu[0].memory_total > 0 and 0 <= cpu[0].memory_free <= cpu[0].memory_total
    assert "CPU" in backend_names()
    assert all(d.kind in DEVICE_KINDS for d in ds)
    assert all(d.kind in ("gpu", "igpu") for d in gpu_devices())
    assert cpu[0].to_dict()["backend"] == "CPU"
