"""Fine-tuning: the training loop (`trainer`), the MoFO optimizer (`mofo`), SFA averaging and L1/L2-to-init
penalties (inside `trainer.train`), and runs over a model pool with periodic forgetting records (`runs`)."""
from forgetlab.train.mofo import MoFO
from forgetlab.train.trainer import TrainResult, train

__all__ = ["MoFO", "TrainResult", "train"]
