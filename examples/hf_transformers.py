"""A Hugging Face Transformers loop, written as Ray Train's docs write it, under
rayguard.RobustTrainer: ``RayTrainReportCallback`` reports each Transformers checkpoint with
``ray.train.report``, ``prepare_trainer`` prepares the Trainer, and a restart resumes with
``trainer.train(resume_from_checkpoint=...)`` from ``ray.train.get_checkpoint()``. No line of
the loop names rayguard: every report is watched (progress, NaN/inf in ``loss``), every
checkpoint gets a sha256 manifest, and a restart gets the newest checkpoint that verifies.

    .venv/bin/python examples/hf_transformers.py [--storage-path DIR] [--max-steps N] [--faults SPEC]

A tiny GPT-2 (2 layers, hidden size 32) built from a config, no download, on synthetic token
sequences; 2 CPU workers (gloo). Ends by printing the run directory and what happened.
"""

from __future__ import annotations

import argparse
import collections
import os
import tempfile
import time

import ray
import ray.train
import torch
import transformers
from ray.train import RunConfig, ScalingConfig
from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer

import rayguard
from rayguard.cli import shell_command
from rayguard.events import read as read_events

VOCAB, SEQ = 64, 16


class CountingDataset(torch.utils.data.Dataset):
    """Token sequences that count up from a random start (mod VOCAB): learnable in a few
    steps. Built from a fixed generator, so every rank and every attempt sees the same data."""

    def __init__(self, size: int = 512) -> None:
        starts = torch.randint(0, VOCAB, (size, 1), generator=torch.Generator().manual_seed(0))
        self.ids = (starts + torch.arange(SEQ)) % VOCAB

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def tiny_gpt2() -> transformers.GPT2LMHeadModel:
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2,
                                     n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def train_func(config):
    transformers.set_seed(0)  # the same initial weights on every rank and every attempt
    model = config.get("model_fn", tiny_gpt2)()
    # Each rank its own scratch directory for Transformers' checkpoints (rank 1 then never
    # copies files rank 0 is still writing); Ray persists every rank's files into one
    # checkpoint, rank 0's model and optimizer beside each rank's rng_state_<rank>.pth.
    rank = ray.train.get_context().get_world_rank()
    args = transformers.TrainingArguments(
        output_dir=os.path.join(tempfile.gettempdir(), f"hf-{os.getpid()}-rank{rank}"),
        max_steps=config["max_steps"],
        per_device_train_batch_size=8,
        learning_rate=5e-3,
        logging_steps=config["save_steps"],
        save_strategy="steps",
        save_steps=config["save_steps"],
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
        seed=rayguard.train.get_context().seed or 0,  # this rank's seed (RNGs in the checkpoint)
        data_seed=0,  # the same data order on every rank: the sampler shards one permutation
        disable_tqdm=True,
        ddp_find_unused_parameters=False,
        **config.get("training_args", {}),
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=CountingDataset(),
                                   callbacks=list(config.get("callbacks", [])))
    trainer.add_callback(RayTrainReportCallback())  # [2] report metrics and checkpoints
    trainer = prepare_trainer(trainer)  # [3] prepare the Trainer for Ray Train

    checkpoint = ray.train.get_checkpoint()  # after a restart: the newest that verifies
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            path = os.path.join(checkpoint_dir, RayTrainReportCallback.CHECKPOINT_NAME)
            trainer.train(resume_from_checkpoint=path)
    else:
        trainer.train()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage-path", default=os.path.expanduser("~/ray_results/rayguard-hf"))
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--faults", default=None,
                        help='rayguard fault injection, e.g. "kill:rank=1,step=20" (SIGKILL '
                             'rank 1 at its step-20 report: the run resumes from the checkpoint '
                             'before)')
    parser.add_argument("--recovery", choices=("restart", "live"), default="restart",
                        help='"live": a failed worker is replaced alone and a NaN rolls back in '
                             'place, the other workers keep their processes; "restart" '
                             "(default): the whole worker group restarts")
    args = parser.parse_args()

    ray.init(address="local", num_cpus=2, include_dashboard=False)
    trainer = rayguard.RobustTrainer(  # was: ray.train.torch.TorchTrainer(...)
        train_func,
        train_loop_config={"max_steps": args.max_steps, "save_steps": 10},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=args.storage_path,
                             name=time.strftime("run-%Y%m%d-%H%M%S")),
        guard_config=rayguard.GuardConfig(faults=args.faults, recovery=args.recovery),
    )
    result = trainer.fit()
    print(f"\nfinished: loss {result.metrics.get('loss')} at step {result.metrics.get('step')}")
    print(f"run directory:   {result.path}")
    print(f"last checkpoint: {result.checkpoint.path}")
    with result.checkpoint.as_directory() as d:  # [5] load the trained model
        model = transformers.GPT2LMHeadModel.from_pretrained(
            os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME))
    print(f"loaded: {type(model).__name__}, {sum(p.numel() for p in model.parameters())} parameters")
    events = read_events(result.path)
    sealed = sum(e["kind"] == "checkpoint_committed" for e in events)
    notable = collections.Counter(e["kind"] for e in events if e["kind"] in (
        "fault_injected", "stall_detected", "nan_detected", "checkpoint_rejected", "restart"))
    print(f"what happened:   {sealed} checkpoints sealed with rayguard's manifest; "
          + (", ".join(f"{k} x{n}" for k, n in notable.items()) or "no fault, no restart"))
    print(f"the whole story: {shell_command('events', result.path)}")


if __name__ == "__main__":
    main()
