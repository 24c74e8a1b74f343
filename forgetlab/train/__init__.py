"""Fine-tuning: the training loop (`trainer`), the MoFO optimizer (`mofo`), SFA averaging and L1/L2-to-init
penalties (inside `trainer.train`), EWC's Fisher and penalty (`ewc`) and HFT's frozen half (`hft`) for sequences
of tasks, LoRA adapters (`lora`), runs over a model pool with periodic forgetting
records (`runs`, on the task's training pairs of `examples`), their results (`results`), their memory
estimate (`memory`) and their default recipe, how the pool's own fine-tunes were trained (`defaults`). The analysis that drives them from the CLI and the app: `forgetlab.analysis.finetune`."""
from forgetlab.train.mofo import MoFO
from forgetlab.train.trainer import TrainResult, train

__all__ = ["MoFO", "TrainResult", "train"]
