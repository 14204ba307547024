"""GPU telemetry: the NVML sampler against a fake pynvml, the monitor's timer, the panel's words."""

from __future__ import annotations

import os

from backend.core.protocol import CheckpointSaved, EvalFinished, MemorySample, MetricsLogged
from studio.services.gpu_monitor import GpuMonitor
from studio.services.nvml_sampler import NvmlSampler, TelemetrySample
from studio.state.telemetry_store import TelemetryStore
from tests.fakes.fake_nvml import GIB, FakeSampler, fake_pynvml


def test_nvml_sampler_reads_memory_v2_utilisation_and_the_workers_share():
    pid = os.getpid()
    nvml = fake_pynvml(processes=[(12345, 5 * GIB), (pid, 2 * GIB)])
    sampler = NvmlSampler(nvml=nvml)
    assert sampler.available and sampler.note == ""
    sample = sampler(pid)
    (device,) = sample.devices
    assert sample.nvml and sample.driver == "570.00"
    assert device.name == "NVIDIA Fake H100" and device.total_bytes == 80 * GIB
    assert device.used_bytes == 3 * GIB  # v2: reserved memory is not "used"
    assert nvml.calls[0] == ("memory", nvml.nvmlMemory_v2)
    assert (device.utilization, device.temperature_c, device.power_w) == (87.0, 66.0, 312.0)
    assert device.process_bytes == 2 * GIB
    assert sample.process_rss and sample.process_rss > 0  # psutil on the "worker" (this process)
    assert sampler(None).devices[0].process_bytes is None


def test_nvml_sampler_falls_back_to_memory_v1_on_an_old_driver():
    nvml = fake_pynvml(v2=False)
    sampler = NvmlSampler(nvml=nvml)
    first, second = sampler(None), sampler(None)
    assert first.devices[0].used_bytes == 3 * GIB + 512 * (1 << 20)
    assert second.devices[0].used_bytes == first.devices[0].used_bytes
    assert nvml.calls.count(("memory", nvml.nvmlMemory_v2)) == 1  # v2 is not retried every sample


def test_without_a_driver_the_sampler_says_so_and_reads_psutil():
    sampler = NvmlSampler(nvml=fake_pynvml(fail_init=True))
    sample = sampler(os.getpid())
    assert not sample.nvml and sample.devices == ()
    assert "No NVIDIA GPU driver" in sample.note and "Driver Not Loaded" in sample.note
    assert sample.process_rss and sample.ram_total > 0
    assert sampler(os.getpid()).process_cpu is not None  # the second reading has a CPU share


def test_the_real_sampler_never_raises_here():
    sample = NvmlSampler()(os.getpid())  # NVML or not, whatever this machine has
    assert isinstance(sample, TelemetrySample)
    assert sample.devices or sample.note


def test_monitor_samples_on_its_timer_and_survives_a_broken_sampler(qtbot):
    fake = FakeSampler()
    monitor = GpuMonitor(fake, interval_ms=20)
    samples: list[TelemetrySample] = []
    monitor.sampled.connect(samples.append)
    monitor.set_worker_pid(4242)
    monitor.start()
    qtbot.waitUntil(lambda: len(samples) >= 3, timeout=5000)
    monitor.stop()
    assert fake.calls[:3] == [4242, 4242, 4242]
    assert samples[-1].devices[0].name == "Fake GPU 24G"

    def broken(pid):
        raise OSError("boom")

    monitor = GpuMonitor(broken, interval_ms=20)
    sample = monitor.sample_now()
    assert not sample.nvml and "telemetry unavailable: boom" in sample.note


def test_telemetry_store_follows_samples_events_and_the_peak(qtbot):
    clock = [100.0]
    store = TelemetryStore(clock=lambda: clock[0])
    sample = FakeSampler()(7)
    store.add_sample(sample)
    assert store.count("gpu_used") == 1 and store.latest("gpu_used") == sample.devices[0].process_bytes
    assert store.device_total == 24 * GIB
    clock[0] = 101.0
    store.apply(MetricsLogged(step=1, max_steps=2, memory=MemorySample(allocated_bytes=GIB, reserved_bytes=2 * GIB,
                                                                        peak_bytes=3 * GIB, rss_bytes=5 * GIB)))
    store.apply(MetricsLogged(step=2, max_steps=2, memory=MemorySample(peak_bytes=2 * GIB)))
    store.apply(EvalFinished(step=2, eval_loss=1.0))
    store.apply(CheckpointSaved(step=2, path="/x"))
    assert store.series("allocated") == ([1.0], [float(GIB)])
    assert store.measured_peak == 3 * GIB and store.measured_kind == "peak allocated"
    assert [(kind, step) for _, kind, step in store.markers] == [("eval", 2), ("save", 2)]
    store.clear()
    assert store.measured_peak is None and not store.markers and store.count("reserved") == 0
    cpu = TelemetryStore()
    cpu.apply(MetricsLogged(step=1, max_steps=1, memory=MemorySample(rss_bytes=GIB)))
    assert cpu.measured_peak == GIB and cpu.measured_kind == "worker RSS"


def test_panel_says_no_driver_in_one_line_and_charts_the_worker(qtbot, make_studio):
    studio = make_studio(sampler=FakeSampler(nvml=False))
    panel = studio.train_page.gpu_panel
    assert panel.readout.text().splitlines()[0] == "No NVIDIA GPU driver (fake)"
    assert panel.util_chart.name == "cpu"
    assert "system RAM" in studio.estimate.limit_label and studio.estimate.device == "cpu"
    assert studio.window.env_label.text().startswith("CUDA: no")


def test_panel_with_a_gpu_shows_its_readouts_and_sizes_the_estimate(qtbot, make_studio):
    studio = make_studio(sampler=FakeSampler())
    panel = studio.train_page.gpu_panel
    text = panel.readout.text()
    assert "GPU 0 Fake GPU 24G" in text and "/ 24.00 GiB" in text and "°C" in text and "W" in text
    assert panel.util_chart.name == "utilization"
    assert studio.estimate.device == "cuda" and studio.estimate.limit_bytes == 24 * GIB
    assert "GPU 0 (Fake GPU 24G)" in studio.pages["techniques"].breakdown.limit_label.text()
    assert "CUDA: yes" in studio.window.env_label.text()
    assert "driver 999.99" in studio.window.env_label.toolTip()
