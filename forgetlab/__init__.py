"""forgetlab: what did fine-tuning change, and what did it cost?

The core library behind the forgetlab app: checkpoints, model pools, task vectors, evaluation, merges,
linearity, sweeps and fine-tuning. Nothing here imports streamlit except `forgetlab.ui`.
"""
from forgetlab.errors import ForgetlabError

__version__ = "0.1.0"
__all__ = ["ForgetlabError", "__version__"]
