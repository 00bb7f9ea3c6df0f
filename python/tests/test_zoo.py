"""The zoo of GPU jobs (scripts/gpu/torch/zoo) and its runner (zoo_check.py), without a GPU: the
registry's contract (families, the validation split), the jobs that need torch alone recorded
at their tiny size, and the runner's dry run end to end on one of them. The jobs that need
transformers, timm, torchvision, torchaudio or peft are not run here (the test environment has
torch alone)."""

import json
import subprocess
import sys
from pathlib import Path

import cudamem.estimate as est
from test_estimate import needs_torch

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "torch"


def _zoo():
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    import zoo

    return zoo


@needs_torch
def test_the_registry_spans_the_families_and_keeps_the_measured_jobs_for_validation():
    zoo = _zoo()
    assert len(zoo.JOBS) >= 14 and len(zoo.VALIDATION) >= 5
    assert set(zoo.VALIDATION) | set(zoo.DEVELOPMENT) == set(zoo.JOBS)
    assert not set(zoo.VALIDATION) & set(zoo.DEVELOPMENT)
    # The four jobs measured before the zoo existed are never developed on.
    assert {"unet_diffusion", "whisper_speech", "convnext_cl", "llama_lora"} <= set(zoo.VALIDATION)
    exercised = {x for j in zoo.JOBS.values() for x in j.exercises}
    for feature in ("LoRA adapters", "frozen backbone", "partially frozen layers", "gradient accumulation",
                    "activation checkpointing", "channels-last", "segmentation", "MoE routing", "torch.compile",
                    "torch.compile reduce-overhead", "KV-cache generation", "variable-length batches",
                    "several streams"):
        assert feature in exercised, feature
    for name, j in zoo.JOBS.items():
        assert len(j.batches) >= 2 and len(j.dry_batches) >= 2 and j.at > 0 and j.dry_at > 0, name
        assert set(j.needs) <= {"transformers", "timm", "torchvision", "torchaudio", "peft"}, name


@needs_torch
def test_the_jobs_that_need_torch_alone_record_at_their_tiny_size():
    import torch

    zoo = _zoo()
    alone = [n for n, j in zoo.JOBS.items() if not j.needs]
    assert len(alone) >= 3
    for name in alone:
        e = est.estimate(zoo.JOBS[name].run, 2, torch.device("cuda"), True, policies=["pytorch"])
        assert e.peak_requested > 0, name


@needs_torch
def test_the_runner_dry_run_writes_its_results_and_gathers_them(tmp_path):
    run = [sys.executable, str(SCRIPTS / "zoo_check.py"), "--dry-run", "--out", str(tmp_path)]
    one = ["--only", "moe_switch", "--allocators", "native", "--caps", "512MiB"]
    # The GPU-free answers made ahead, then taken from their file by the run.
    p = subprocess.run(run + one + ["--gpu-free-only"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and (tmp_path / "zoo-moe_switch-gpufree.json").exists(), p.stdout + p.stderr[-2000:]
    p = subprocess.run(run + one + ["--tries", "1"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    r = json.loads((tmp_path / "zoo-moe_switch.json").read_text())
    assert r["gpu_free"]["from_file"] == "zoo-moe_switch-gpufree.json", r["gpu_free"].keys()
    assert r["set"] == "development" and r["measured"]["native"]["ok"], r
    # A dry run's measurement is the recording itself: the estimate agrees by construction.
    assert r["measured"]["native"]["error"] == 0.0, r["measured"]
    row = r["gpu_free"]["largest"][str(512 << 20)]["rows"][0]
    capped = r["capped"]["512MiB"]["native"]
    assert capped["safe"]["batch"] == row["safe_batch"] and capped["first_failing"]["batch"] == row["largest_batch"] + 1
    assert capped["safe"]["runs"][0]["ok"] is True and capped["first_failing"]["runs"][0]["ok"] is False, capped
    md = (tmp_path / "zoo-check.md").read_text()
    assert "dry run" in md and "| moe_switch | development |" in md, md
    # A second run finds the results and skips the job; a bad option is an error naming it.
    p = subprocess.run(run + one, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "skipped" in p.stdout, p.stdout + p.stderr
    p = subprocess.run(run + ["--only", "moe_switch", "--allocators", "tcmalloc"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and "--allocators" in p.stderr, p.stderr


def test_the_cap_search_finds_the_largest_batch_from_any_nearby_guess():
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    import cap_check

    for limit in (1, 2, 7, 50, 99, 1000, 4096):
        for start in {1, 3, 50, 120, 5000} & set(range(max(1, limit // 4), 4 * limit + 1)):
            ok, bad, tried = cap_check.search(lambda b: b <= limit, start)
            assert (ok, bad) == (limit, limit + 1), (limit, start, tried)
            assert len(tried) <= 3 * cap_check.MAX_PROBES + 1, (limit, start, tried)
    # A job too large for batch 1: nothing ran, batch 1 is the first failure.
    assert cap_check.search(lambda b: False, 10)[:2] == (0, 1)


@needs_torch
def test_the_cap_runner_dry_run_finds_a_largest_batch_per_allocator_and_times_them(tmp_path):
    run = [sys.executable, str(SCRIPTS / "cap_check.py"), "--dry-run", "--out", str(tmp_path), "--only",
           "moe_switch", "--caps", "512MiB", "--tries", "1", "--rounds", "1"]
    p = subprocess.run(run, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    r = json.loads((tmp_path / "cap-moe_switch.json").read_text())
    c = r["caps"]["512MiB"]
    assert r["variable"] and set(c["largest"]) == {"native", "expandable", "cudamem"}, r
    for al, found in c["largest"].items():
        # The largest batch ran and the next one failed, each in a process of its own.
        runs = {t["batch"]: t["ok"] for t in found["tries"]}
        assert found["largest"] > 0 and runs[found["largest"]] is True, (al, found)
        assert runs.get(found["first_failed"]) is False, (al, found)
    assert c["time"]["batch"] == min(f["largest"] for f in c["largest"].values())
    assert "| moe_switch | variable |" in (tmp_path / "cap-check.md").read_text()
    p = subprocess.run(run[:2] + ["--dry-run", "--caps", "3GiB"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--caps" in p.stderr, p.stderr
