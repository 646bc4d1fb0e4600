"""Standalone verified checkpoints (no Ray): save, corrupt, verify, fall back.

    .venv/bin/python examples/checkpointing.py
"""

import os
import tempfile

import torch

from rayguard import checkpoint
from rayguard.cli import shell_command

root = tempfile.mkdtemp(prefix="rayguard-ckpt-")
model = torch.nn.Linear(16, 4).to(torch.bfloat16)
for step in (10, 20, 30):
    checkpoint.save(os.path.join(root, f"checkpoint_{step:06d}"),
                    {"model": model.state_dict(), "step": step}, step=step)

# Bit-rot in the newest checkpoint: flip one byte of its shard.
newest = os.path.join(root, "checkpoint_000030")
shard = next(f for f in os.listdir(newest) if f.endswith(".safetensors"))
with open(os.path.join(newest, shard), "r+b") as f:
    f.seek(100)
    b = f.read(1)
    f.seek(100)
    f.write(bytes([b[0] ^ 1]))

print("verify newest:", checkpoint.verify(newest).describe())
path, report = checkpoint.find_latest_valid(root)
state = checkpoint.load(path)
print(f"newest valid: {os.path.basename(path)} (step {state['step']}), ok={report.ok}")
print(f"inspect from the shell: {shell_command('checkpoint', 'ls', root)}")
