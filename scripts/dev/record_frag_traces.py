"""Records the extra acceptance traces of docs/design/fragmentation.md on the CPU, no GPU.

Each workload of scripts/gpu/torch/fit_models.py (generate: a growing key/value cache; ckpt:
activation checkpointing; bert: variable sequence lengths) runs under
``cudamem.estimate.recording()`` at two batch sizes, and its trace is written gzip-compressed to
tests/data/est/<workload>_b<batch>.pickle.gz. Needs torch and the cudamem package importable:
``python scripts/dev/record_frag_traces.py [OUT_DIR]`` from the repository root.
"""

import gzip
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "gpu", "torch"))

import torch  # noqa: E402

import cudamem.estimate as est  # noqa: E402
from fit_models import WORKLOADS  # noqa: E402

RUNS = [("generate", 2), ("generate", 4), ("ckpt", 1), ("ckpt", 2), ("bert", 4), ("bert", 8)]


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "tests", "data", "est")
    for name, batch in RUNS:
        fn = WORKLOADS[name][0]
        with est.recording() as rec:
            fn(batch, torch.device("cuda"))
        path = os.path.join(out, f"{name}_b{batch}.pickle.gz")
        with gzip.open(path, "wb", compresslevel=9) as f:
            f.write(rec.builder.pickle())
        print(path, os.path.getsize(path), "bytes,", len(rec.builder.events), "events", flush=True)


if __name__ == "__main__":
    main()
