"""RobustTrainer (being written)."""
from ray.train.torch import TorchTrainer


class RobustTrainer(TorchTrainer):
    pass
