"""forgetlab: what did fine-tuning change, and what did it cost?

The core library behind the forgetlab app: checkpoints, model pools, task vectors, evaluation, merges,
linearity, sweeps and fine-tuning. Nothing here imports streamlit except `forgetlab.ui`.
"""
import warnings

from forgetlab.core.errors import ForgetlabError

# PEFT reads transformers' deprecated `is_gradient_checkpointing` on every adapter it wraps, and transformers
# warns each time (zoo builds, LoRA pools, tests): a message no forgetlab user can act on.
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)

__version__ = "0.1.0"
__all__ = ["ForgetlabError", "__version__"]
