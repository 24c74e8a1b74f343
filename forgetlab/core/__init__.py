"""What every job stands on: checkpoints (reading, LoRA adapters, loading, writing), the model pool, probe data,
evaluation, model anatomy, safe outputs, the workspace, YAML files, errors, progress and device maps.

Nothing here imports from `forgetlab.merge`, `forgetlab.analysis` or anything above them.
"""
