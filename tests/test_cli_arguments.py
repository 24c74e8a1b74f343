"""CLI arguments shared by several commands are declared once (forgetlab/commands/args.py) and behave as before.

The tables below were recorded from the parser before the shared declarations replaced the per-command ones: for
every (sub)command, each argument's option strings, default, required flag, type (after cli._check_arguments:
`count` ≥ 1, `number` ≥ 0, `_device`), choices, nargs and metavar, keyed by dest. Since issue 41 every other
whole number is an `integer` (within 64 bits), a `--seed` a `seed` and every decimal number `finite`.
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from forgetlab import cli
from forgetlab.commands import args as shared
from forgetlab.core.errors import ForgetlabError

# dest: (option strings, default, required, type name, choices, nargs, metavar); () for a positional.
SWEEP_COMMON = {
    'pool': ((), None, True, None, None, None, None),
    'model': (('--model',), None, True, None, None, None, None),
    'task': (('--task',), None, False, None, None, None, None),
    'tasks': (('--tasks',), None, False, None, None, '*', None),
    'max_general': (('--max-general',), None, False, 'count', None, None, None),
    'max_task': (('--max-task',), None, False, 'count', None, None, None),
    'measure': (('--measure',), 'exact_match', False, None, None, None, None),
    'general_measure': (('--general-measure',), 'general_loss', False, None, None, None, None),
    'lm_eval_include': (('--lm-eval-include',), None, False, None, None, None, 'DIR'),
    'limit': (('--limit',), None, False, 'count', None, None, None),
    'batch_size': (('--batch-size',), 16, False, 'count', None, None, None),
    'device': (('--device',), None, False, '_device', None, None, None),
    'out': (('--out',), None, False, None, None, None, None),
    'no_save': (('--no-save',), False, False, None, None, 0, None),
    'executor': (('--executor',), 'local', False, None, ('local', 'ray'), None, None),
    'ray_address': (('--ray-address',), None, False, None, None, None, 'ADDR'),
    'workers': (('--workers',), None, False, 'count', None, None, None),
    'gpus_per_worker': (('--gpus-per-worker',), None, False, 'finite', None, None, 'G'),
    'device_map': (('--device-map',), None, False, None, ('auto', 'balanced', 'sequential'), None, None),
    'max_memory': (('--max-memory',), None, False, None, None, None, 'DEV=SIZE,…'),
    'dtype': (('--dtype',), 'float32', False, None, ('float32', 'bfloat16', 'float16'), None, None),
    'overwrite': (('--overwrite',), False, False, None, None, 0, None),
}
ZOO_COMMON = {
    'preset': (('--preset',), 'pico', False, None, ('pico', 'smol'), None, None),
    'size': (('--size',), 'default', False, None, ('tiny', 'default'), None, None),
    'home': (('--home',), None, False, None, None, None, None),
}
EXPECTED = {
    'attribution': {
        'pool': ((), None, True, None, None, None, None),
        'model': (('--model',), None, True, None, None, None, None),
        'task': (('--task',), None, False, None, None, None, None),
        'level': (('--level',), 'module', False, None, None, None, None),
        'select': (('--select',), None, False, None, None, '+', None),
        'alphas': (('--alphas',), None, False, None, None, None, None),
        'max_general': (('--max-general',), None, False, 'count', None, None, None),
        'max_task': (('--max-task',), None, False, 'count', None, None, None),
        'batch_size': (('--batch-size',), 16, False, 'count', None, None, None),
        'device': (('--device',), None, False, '_device', None, None, None),
        'out': (('--out',), None, False, None, None, None, None),
        'no_save': (('--no-save',), False, False, None, None, 0, None),
        'overwrite': (('--overwrite',), False, False, None, None, 0, None),
    },
    'features': {
        'pool': ((), None, True, None, None, None, None),
        'models': (('--models',), None, False, None, None, '+', None),
        'tasks': (('--tasks',), None, False, None, None, '+', None),
        'level': (('--level',), 'layer', False, None, ('model', 'layer', 'attn', 'mlp', 'head'), None, None),
        'layer': (('--layer',), -1, False, 'integer', None, None, None),
        'head': (('--head',), None, False, 'integer', None, None, None),
        'pooling': (('--pooling',), 'answer', False, None, ('answer', 'last'), None, None),
        'samples': (('--samples',), None, False, 'count', None, None, None),
        'perplexity': (('--perplexity',), 30.0, False, 'finite', None, None, None),
        'pca_dims': (('--pca-dims',), 50, False, 'integer', None, None, None),
        'seed': (('--seed',), 0, False, 'seed', None, None, None),
        'backend': (('--backend',), 'auto', False, None, ('auto', 'opentsne', 'sklearn'), None, None),
        'device': (('--device',), None, False, '_device', None, None, None),
        'out': (('--out',), None, False, None, None, None, None),
        'distances': (('--distances',), None, False, None, None, None, None),
        'overwrite': (('--overwrite',), False, False, None, None, 0, None),
    },
    'finetune': {
        'pool': ((), None, True, None, None, None, None),
        'task': (('--task',), None, True, None, None, None, None),
        'start': (('--start',), 'base', False, None, None, None, None),
        'optimizer': (('--optimizer',), 'adamw', False, None, ('adamw', 'mofo', 'sgd'), None, None),
        'fraction': (('--fraction',), 0.2, False, 'finite', None, None, None),
        'steps': (('--steps',), None, False, 'count', None, None, None),     # issue 43: the pool's own recipe
        'batch_size': (('--batch-size',), None, False, 'count', None, None, None),
        'lr': (('--lr',), None, False, 'finite', None, None, None),
        'weight_decay': (('--weight-decay',), 0.0, False, 'finite', None, None, None),
        'warmup': (('--warmup',), None, False, 'number', None, None, None),
        'schedule': (('--schedule',), 'cosine', False, None, ('cosine', 'constant'), None, None),
        'seed': (('--seed',), 0, False, 'seed', None, None, None),
        'sfa_p': (('--sfa-p',), None, False, 'finite', None, None, None),
        'sfa_beta': (('--sfa-beta',), None, False, 'finite', None, None, None),   # 0.5, or 0.25 in --compare
        'l1': (('--l1',), 0.0, False, 'finite', None, None, None),
        'l2': (('--l2',), 0.0, False, 'finite', None, None, None),
        'compare': (('--compare',), False, False, None, None, 0, None),
        'eval_every': (('--eval-every',), None, False, 'count', None, None, None),
        'max_general': (('--max-general',), None, False, 'count', None, None, None),
        'max_task': (('--max-task',), None, False, 'count', None, None, None),
        'max_train': (('--max-train',), None, False, 'count', None, None, None),
        'device': (('--device',), None, False, '_device', None, None, None),
        'save_as': (('--save-as',), None, False, None, None, None, None),
        'out': (('--out',), None, False, None, None, None, None),
        'no_save': (('--no-save',), False, False, None, None, 0, None),
        'measure': (('--measure',), 'exact_match', False, None, None, None, None),
        'general_measure': (('--general-measure',), 'general_loss', False, None, None, None, None),
        'lm_eval_include': (('--lm-eval-include',), None, False, None, None, None, 'DIR'),
        'limit': (('--limit',), None, False, 'count', None, None, None),
        'executor': (('--executor',), 'local', False, None, ('local', 'ray'), None, None),
        'ray_address': (('--ray-address',), None, False, None, None, None, 'ADDR'),
        'workers': (('--workers',), None, False, 'count', None, None, None),
        'gpus_per_worker': (('--gpus-per-worker',), None, False, 'finite', None, None, 'G'),
        'overwrite': (('--overwrite',), False, False, None, None, 0, None),
    },
    'linearity': {
        'pool': ((), None, True, None, None, None, None),
        'task': (('--task',), None, True, None, None, None, None),
        'model': (('--model',), None, False, None, None, None, None),
        'levels': (('--levels',), ['model', 'layer', 'attn', 'mlp', 'head'],
                   False, None, ('model', 'layer', 'attn', 'mlp', 'head'), '+', None),
        'alphas': (('--alphas',), '0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9', False, None, None, None, None),
        'samples': (('--samples',), 30, False, 'count', None, None, None),
        'seed': (('--seed',), None, False, 'seed', None, None, None),
        'capture': (('--capture',), 'finetuned', False, None, ('finetuned', 'base'), None, None),
        'batch_size': (('--batch-size',), 8, False, 'count', None, None, None),
        'device': (('--device',), None, False, '_device', None, None, None),
        'out': (('--out',), None, False, None, None, None, None),
        'curves': (('--curves',), None, False, None, None, None, None),
        'overwrite': (('--overwrite',), False, False, None, None, 0, None),
        'no_save': (('--no-save',), False, False, None, None, 0, None),
    },
    'slwm-weights': {
        'pool': ((), None, True, None, None, None, None),
        'models': (('--models',), None, False, None, None, '+', None),
        'tasks': (('--tasks',), None, False, None, None, '+', None),
        'level': (('--level',), 'attn_mlp', False, None, ('layer', 'attn_mlp', 'head_mlp'), None, None),
        'samples': (('--samples',), 30, False, 'count', None, None, None),
        'ridge': (('--ridge',), 0.0001, False, 'finite', None, None, None),
        'seed': (('--seed',), None, False, 'seed', None, None, None),
        'device': (('--device',), None, False, '_device', None, None, None),
        'out': (('--out',), None, False, None, None, None, None),
        'overwrite': (('--overwrite',), False, False, None, None, 0, None),
    },
    'merge': {
        'recipe': ((), None, True, None, None, None, None),
        'out_dir': ((), None, True, None, None, None, None),
        'overwrite': (('--overwrite',), False, False, None, None, 0, None),
        'device': (('--device',), 'cpu', False, '_device', None, None, None),
        'pool': (('--pool',), None, False, None, None, None, None),
        'eval': (('--eval',), False, False, None, None, 0, None),
        'lm_eval': (('--lm-eval',), None, False, None, None, None, 'TASK[,TASK…]'),
        'lm_eval_include': (('--lm-eval-include',), None, False, None, None, None, 'DIR'),
        'limit': (('--limit',), None, False, 'count', None, None, None),
        'no_lm_eval': (('--no-lm-eval',), False, False, None, None, 0, None),
        'max_general': (('--max-general',), None, False, 'count', None, None, None),
        'max_task': (('--max-task',), None, False, 'count', None, None, None),
    },
    'methods': {
        'json': (('--json',), False, False, None, None, 0, None),
    },
    'merge-export': {
        'recipe': ((), None, True, None, None, None, None),
        'to': (('--to',), 'mergekit', False, None, ('mergekit', 'forgetlab'), None, None),
        'out': (('--out',), None, False, None, None, None, None),
        'overwrite': (('--overwrite',), False, False, None, None, 0, None),
    },
    'pcb-search': {
        'recipe': ((), None, True, None, None, None, None),
        'pool': (('--pool',), None, True, None, None, None, None),
        'budget': (('--budget',), 30, False, 'count', None, None, None),
        'seed': (('--seed',), 0, False, 'seed', None, None, None),
        'out': (('--out',), None, False, None, None, None, None),
        'executor': (('--executor',), 'local', False, None, ('local', 'ray'), None, None),
        'ray_address': (('--ray-address',), None, False, None, None, None, 'ADDR'),
        'workers': (('--workers',), None, False, 'count', None, None, None),
        'gpus_per_worker': (('--gpus-per-worker',), None, False, 'finite', None, None, 'G'),
        'overwrite': (('--overwrite',), False, False, None, None, 0, None),
    },
    'inspect': {
        'ref': ((), None, True, None, None, None, None),
        'base': (('--base',), None, False, None, None, None, None),
        'tensors': (('--tensors',), False, False, None, None, 0, None),
    },
    'taskvec': {
        'pool': ((), None, True, None, None, None, None),
        'out': (('--out',), None, False, None, None, None, None),
        'overwrite': (('--overwrite',), False, False, None, None, 0, None),
    },
    'eval': {
        'pool': ((), None, True, None, None, None, None),
        'models': (('--models',), None, False, None, None, '*', None),
        'max_general': (('--max-general',), None, False, 'count', None, None, None),
        'max_task': (('--max-task',), None, False, 'count', None, None, None),
        'device': (('--device',), None, False, '_device', None, None, None),
        'out': (('--out',), None, False, None, None, None, None),
        'lm_eval': (('--lm-eval',), None, False, None, None, None, 'TASK[,TASK…]'),
        'lm_eval_include': (('--lm-eval-include',), None, False, None, None, None, 'DIR'),
        'limit': (('--limit',), None, False, 'count', None, None, None),
        'no_lm_eval': (('--no-lm-eval',), False, False, None, None, 0, None),
        'general_loss': (('--general-loss',), 'blocks', False, None, ('blocks', 'documents'), None, None),
        'device_map': (('--device-map',), None, False, None, ('auto', 'balanced', 'sequential'), None, None),
        'max_memory': (('--max-memory',), None, False, None, None, None, 'DEV=SIZE,…'),
        'overwrite': (('--overwrite',), False, False, None, None, 0, None),
    },
    'search': {
        'recipe': ((), None, True, None, None, None, None),
        'pool': (('--pool',), None, True, None, None, None, None),
        'budget': (('--budget',), 30, False, 'count', None, None, None),
        'objective': (('--objective',), 'constrained', False, None, ('constrained', 'weighted'), None, None),
        'max_forgetting': (('--max-forgetting',), 0.05, False, 'finite', None, None, None),
        'forgetting_weight': (('--forgetting-weight',), 1.0, False, 'finite', None, None, None),
        'measure': (('--measure',), 'exact_match', False, None, None, None, None),
        'lm_eval_include': (('--lm-eval-include',), None, False, None, None, None, 'DIR'),
        'limit': (('--limit',), None, False, 'count', None, None, None),
        'task': (('--task',), None, False, None, None, None, None),
        'param': (('--param',), None, False, None, None, None, None),
        'bounds': (('--bounds',), '0,2', False, None, None, None, None),
        'hma_blocks': (('--hma-blocks',), 0, False, 'integer', None, None, None),
        'sigma0': (('--sigma0',), 0.3, False, 'finite', None, None, None),
        'popsize': (('--popsize',), None, False, 'integer', None, None, None),
        'seed': (('--seed',), 0, False, 'seed', None, None, None),
        'max_general': (('--max-general',), None, False, 'count', None, None, None),
        'max_task': (('--max-task',), None, False, 'count', None, None, None),
        'batch_size': (('--batch-size',), 16, False, 'count', None, None, None),
        'device': (('--device',), None, False, '_device', None, None, None),
        'out': (('--out',), None, False, None, None, None, None),
        'save_recipe': (('--save-recipe',), None, False, None, None, None, 'FILE.yaml'),
        'no_save': (('--no-save',), False, False, None, None, 0, None),
        'executor': (('--executor',), 'local', False, None, ('local', 'ray'), None, None),
        'ray_address': (('--ray-address',), None, False, None, None, None, 'ADDR'),
        'workers': (('--workers',), None, False, 'count', None, None, None),
        'gpus_per_worker': (('--gpus-per-worker',), None, False, 'finite', None, None, 'G'),
        'overwrite': (('--overwrite',), False, False, None, None, 0, None),
    },
    'sweep alpha': {
        **SWEEP_COMMON,
        'alphas': (('--alphas',), '0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1', False, None, None, None, None),
        'methods': (('--methods',), ['wise-ft'], False, None, None, '+', None),
    },
    'sweep pruning': {
        **SWEEP_COMMON,
        'ratios': (('--ratios',), '0,0.2,0.4,0.6,0.8,0.9,0.95,0.99,1', False, None, None, None, None),
        'scores': (('--scores',), ['fapm', 'magnitude', 'relative'], False, None, None, '+', None),
    },
    'sweep density': {
        **SWEEP_COMMON,
        'drops': (('--drops',), '0,0.5,0.7,0.9,0.95,0.99', False, None, None, None, None),
        'keeps': (('--keeps',), '1,0.5,0.3,0.2,0.1,0.05,0.01', False, None, None, None, None),
        'methods': (('--methods',), ['dare', 'ties'], False, None, None, '+', None),
        'seed': (('--seed',), 0, False, 'seed', None, None, None),
    },
    'sweep hma': {
        **SWEEP_COMMON,
        'grid': (('--grid',), None, False, None, None, '+', None),
    },
    'sweep lines': {
        **SWEEP_COMMON,
        'betas': (('--betas',), '0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1', False, None, None, None, None),
    },
    'sweep rank': {
        **SWEEP_COMMON,
        'ranks': (('--ranks',), '1,0.5,0.25,0.1,0.05,0.02,0.01', False, None, None, None, None),
    },
    'sweep iso': {
        **SWEEP_COMMON,
        'iso_alphas': (('--iso-alphas',), '0,0.25,0.5,0.75,1,1.25,1.5,2', False, None, None, None, None),
    },
    'sweep': {'list': (('--list',), '==SUPPRESS==', False, None, None, 0, None)},   # issue 45: --list
    'textdiff': {
        'pool': ((), None, True, None, None, None, None),
        'model': (('--model',), None, True, None, None, None, None),
        'alpha': (('--alpha',), None, False, 'finite', None, None, None),
        'against': (('--against',), 'base', False, None, None, None, None),
        'text': (('--text',), None, False, None, None, None, 'FILE'),
        'split': (('--split',), None, False, None, ('heldout',), None, None),
        'max_general': (('--max-general',), None, False, 'count', None, None, None),
        'general_loss': (('--general-loss',), 'blocks', False, None, ('blocks', 'documents'), None, None),
        'batch_size': (('--batch-size',), 16, False, 'count', None, None, None),
        'device': (('--device',), None, False, '_device', None, None, None),
        'no_lens': (('--no-lens',), False, False, None, None, 0, None),
        'lens_blocks': (('--lens-blocks',), 64, False, 'integer', None, None, None),
        'top': (('--top',), 10, False, 'integer', None, None, None),
        'out': (('--out',), None, False, None, None, None, None),
        'no_save': (('--no-save',), False, False, None, None, 0, None),
        'overwrite': (('--overwrite',), False, False, None, None, 0, None),
    },
    'zoo build': {
        **ZOO_COMMON,
        'force': (('--force',), False, False, None, None, 0, None),
    },
    'zoo show': {
        **ZOO_COMMON,
        'out': (('--out',), None, False, None, None, None, None),
        'overwrite': (('--overwrite',), False, False, None, None, 0, None),
    },
    'zoo': {},
    '': {
        'version': (('--version',), '==SUPPRESS==', False, None, None, 0, None),
    },
}

# Issue 44: the task sequence, an analysis whose --out is a folder (matrix.csv and summary.csv)
EXPECTED["sequence"] = {
    'pool': ((), None, True, None, None, None, None),
    'order': (('--order',), None, True, 'names', None, None, 'TASK[,TASK…]'),
    'method': (('--method',), 'adamw', False, 'word', ('adamw', 'mofo', 'sfa', 'l2-init', 'l1-init', 'proximal',
                                                       'ewc', 'hft', 'replay', 'lora', 'mofo+replay', 'mofo+ewc'),
               None, None),
    'compare': (('--compare',), None, False, 'names', None, None, 'M[,M…]'),
    'merge': (('--merge',), None, False, 'names', None, None, 'METHOD[,…]'),
    'steps': (('--steps',), None, False, 'count', None, None, None),
    'lr': (('--lr',), None, False, 'finite', None, None, None),
    'batch_size': (('--batch-size',), None, False, 'count', None, None, None),
    'warmup': (('--warmup',), None, False, 'number', None, None, None),
    'seed': (('--seed',), 0, False, 'seed', None, None, None),
    'fraction': (('--fraction',), 0.2, False, 'finite', None, None, None),
    'sfa_p': (('--sfa-p',), 0.25, False, 'finite', None, None, None),
    'sfa_beta': (('--sfa-beta',), 0.25, False, 'finite', None, None, None),
    'l2': (('--l2',), 1.0, False, 'finite', None, None, None),
    'l1': (('--l1',), 0.001, False, 'finite', None, None, None),
    'proximal': (('--proximal',), 1.0, False, 'finite', None, None, None),
    'ewc': (('--ewc',), 1000.0, False, 'finite', None, None, None),
    'fisher_samples': (('--fisher-samples',), 256, False, 'count', None, None, None),
    'replay': (('--replay',), 0.25, False, 'finite', None, None, None),
    'hft': (('--hft',), 0.5, False, 'finite', None, None, None),
    'lora': (('--lora',), 8, False, 'rank', None, None, 'R'),
    'max_general': (('--max-general',), None, False, 'count', None, None, None),
    'max_task': (('--max-task',), None, False, 'count', None, None, None),
    'max_train': (('--max-train',), None, False, 'count', None, None, None),
    'device': (('--device',), None, False, '_device', None, None, None),
    'dtype': (('--dtype',), None, False, 'word', ('float32', 'bfloat16', 'float16'), None, None),
    'out_folder': (('--out',), None, False, None, None, None, 'DIR'),
    'no_save': (('--no-save',), False, False, None, None, 0, None),
    'dry_run': (('--dry-run',), False, False, None, None, 0, None),
    'overwrite': (('--overwrite',), False, False, None, None, 0, None),
}

# Issue 28 (5 Dec): a dtype on every job (default None: bfloat16 on cuda, float32 on cpu, so the sweeps' default
# changed from "float32"), --dry-run, and the LoRA / checkpointing options of finetune.
_DTYPE = (("--dtype",), None, False, None, ("float32", "bfloat16", "float16"), None, None)
_DRY_RUN = (("--dry-run",), False, False, None, None, 0, None)
for _path in [p for p in EXPECTED if p.startswith("sweep ")] + ["attribution", "finetune", "linearity", "eval"]:
    EXPECTED[_path].update(dtype=_DTYPE, dry_run=_DRY_RUN)
EXPECTED["finetune"].update(
    gradient_checkpointing=(("--gradient-checkpointing",), False, False, None, None, 0, None),
    lora=(("--lora",), None, False, "rank", None, None, "R"),         # issue 41: left out for a full fine-tune
    lora_alpha=(("--lora-alpha",), None, False, "finite", None, None, "A"),
    lora_targets=(("--lora-targets",), None, False, "names", None, None, "NAME[,NAME…]"))
# Issue 45: MoFO's ablations (its filter, per-head partitions, Lion and MoFO-Lion) and the training sequence length.
EXPECTED["finetune"].update(
    optimizer=(("--optimizer",), "adamw", False, "word", ("adamw", "mofo", "lion", "mofo-lion", "sgd"), None, None),
    filter=(("--filter",), "momentum", False, "word", ("momentum", "gradient", "mv", "gv", "random"), None, None),
    partition=(("--partition",), "tensor", False, "word", ("tensor", "head"), None, None),
    max_length=(("--max-length",), 256, False, "integer", None, None, None),
    hft=(("--hft",), 0.0, False, "finite", None, None, None))           # HFT as an option of the single fine-tune
# Issue 28, features / textdiff / search: the same --dtype and --dry-run.
for _path in ["features", "textdiff", "search"]:
    EXPECTED[_path].update(dtype=_DTYPE, dry_run=_DRY_RUN)
# Issue 28 (6 Dec): merge (its scoring's dtype) and pcb-search (and the device its working copy runs on).
for _path in ["merge", "pcb-search"]:
    EXPECTED[_path].update(dtype=_DTYPE, dry_run=_DRY_RUN)
EXPECTED["pcb-search"]["device"] = (("--device",), None, False, "_device", None, None, None)
EXPECTED["slwm-weights"]["dry_run"] = _DRY_RUN

POSITIONALS = {
    "attribution": ["pool"], "features": ["pool"], "finetune": ["pool"], "linearity": ["pool"],
    "slwm-weights": ["pool"], "merge": ["recipe", "out_dir"], "merge-export": ["recipe"], "pcb-search": ["recipe"],
    "inspect": ["ref"], "taskvec": ["pool"], "eval": ["pool"], "search": ["recipe"], "sweep alpha": ["pool"],
    "sweep pruning": ["pool"], "sweep density": ["pool"], "sweep hma": ["pool"],
    "sweep lines": ["pool"], "sweep rank": ["pool"], "sweep iso": ["pool"], "textdiff": ["pool"], "sequence": ["pool"],
}
SUBCOMMANDS = {"": ("command", False), "sweep": ("kind", True), "zoo": ("zoo_command", False)}
FUNCS = {
    "attribution": "cmd_attribution", "features": "cmd_features", "finetune": "cmd_finetune",
    "linearity": "cmd_linearity", "slwm-weights": "cmd_slwm_weights", "merge": "_merge", "methods": "_methods",
    "merge-export": "_export", "pcb-search": "_pcb_search", "inspect": "cmd_inspect", "taskvec": "cmd_taskvec",
    "eval": "cmd_eval", "search": "cmd_search", "sweep alpha": "cmd_sweep", "sweep pruning": "cmd_sweep",
    "sweep density": "cmd_sweep", "sweep hma": "cmd_sweep",
    "sweep lines": "cmd_sweep", "sweep rank": "cmd_sweep", "sweep iso": "cmd_sweep", "sweep": None,
    "textdiff": "cmd_textdiff", "zoo build": "cmd_build",
    "zoo show": "cmd_show", "zoo": "<lambda>", "": None,
}
# One wording per shared argument wherever it means the same thing; a per-command help only where the meaning
# differs (merge's --device and --overwrite are about the merge and OUT_DIR).
HELPS = {
    "--device": {shared.DEVICE_HELP, shared.DEVICE_CPU_HELP, "Where the arithmetic runs: cpu (default) or cuda."},
    "--overwrite": {shared.OVERWRITE_HELP, "Replace OUT_DIR if it exists (only once complete)."},
    "--no-save": {"do not save the run under the workspace's runs/"},
    "--max-general": {"at most this many general-text blocks", "--eval: at most this many general-text blocks"},
    "--max-task": {"at most this many eval pairs per task", "at most this many probe pairs per task",
                   "--eval: at most this many eval pairs per task"},
    "--samples": {"probe samples per task (default 30)", "probe samples per task (default: all)"},
    "--limit": {"at most this many examples per lm-eval task"},
    "--lm-eval-include": {"folder of local lm-eval task YAMLs (default: the pool's probes.benchmarks.include)"},
}
# Commands whose --device default (None) ends on the CPU (ModelPool.load), and those where it means cuda when
# available (load_model / check_device).
CPU_DEFAULT = {"features", "linearity", "slwm-weights", "eval", "textdiff", "pcb-search"}
CUDA_DEFAULT = {"attribution", "finetune", "sequence", "search", "sweep alpha", "sweep pruning", "sweep density", "sweep hma",
                "sweep lines", "sweep rank", "sweep iso"}


def _parsers():
    """(path, parser) for the root parser and every (nested) subcommand; path as typed ("sweep alpha"). The studies
    (`forgetlab study NAME`, issue 45) came after these tables: tests/test_study_framework.py checks them."""
    def walk(parser, prefix):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    if prefix + (name,) == ("study",):
                        continue
                    yield from walk(sub, prefix + (name,))
        yield " ".join(prefix), parser
    return dict(walk(cli.build_parser(), ()))


def _arguments(parser):
    return [a for a in parser._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def _row(a):
    type_name = getattr(a.type, "__name__", None) if a.type is not None else None
    return (tuple(a.option_strings), a.default, a.required, type_name,
            tuple(a.choices) if a.choices is not None else None, a.nargs, a.metavar)


@pytest.fixture(scope="module")
def parsers():
    return _parsers()


def test_the_same_commands(parsers):
    assert sorted(parsers) == sorted(EXPECTED)
    for path, (dest, required) in SUBCOMMANDS.items():
        [action] = [a for a in parsers[path]._actions if isinstance(a, argparse._SubParsersAction)]
        assert (action.dest, action.required) == (dest, required)


def _same_default(expected, got) -> bool:
    """A default the user sees the same: equal, or a comma-separated number list made from a tuple of the same
    numbers (a command generated from its settings keeps the numbers, not the string)."""
    if expected == got:
        return True
    if isinstance(expected, str) and isinstance(got, (tuple, list)):
        try:
            return [float(x) for x in expected.split(",")] == [float(x) for x in got]
        except ValueError:
            return False
    return isinstance(expected, list) and isinstance(got, tuple) and list(got) == expected


def _same_row(expected, got) -> bool:
    """Same option strings, required flag, choices and nargs; the same default as the user sees it; the same type
    and metavar where the table names one ('numbers' stands for a comma-separated list read by the command)."""
    (e_opts, e_default, e_req, e_type, e_choices, e_nargs, e_meta) = expected
    (g_opts, g_default, g_req, g_type, g_choices, g_nargs, g_meta) = got
    return (e_opts == g_opts and e_req == g_req and e_choices == g_choices and e_nargs == g_nargs
            and _same_default(e_default, g_default) and (e_type is None or e_type == g_type)
            and (e_meta is None or e_meta == g_meta))


# Issue 42: commands made from an analysis' settings (forgetlab.commands.generated) take the executor flags too
# (the whole analysis runs on a Ray worker) and --dry-run, and their function is `run_analysis`.
GENERATED = {"linearity", "attribution", "textdiff", "features", "search", "pcb-search", "slwm-weights",
             "sweep alpha", "sweep pruning", "sweep density", "sweep hma", "sweep lines", "sweep rank", "sweep iso",
             "finetune", "taskvec", "sequence"}
EXECUTOR_FLAGS = {k: SWEEP_COMMON[k] for k in ("executor", "ray_address", "workers", "gpus_per_worker")}
for _path in GENERATED:
    EXPECTED[_path].update(EXECUTOR_FLAGS)
# Issue 42: an analysis saves its run (DESIGN: every run is saved), so a generated command that saved none before
# gains --no-save (features saves its map from the CLI too, as the page always did); pcb-search gains
# --merge OUT_DIR (λ search, then merge: the Merge page's path).
EXPECTED["features"]["no_save"] = (("--no-save",), False, False, None, None, 0, None)
EXPECTED["pcb-search"].update(no_save=(("--no-save",), False, False, None, None, 0, None),
                              merge=(("--merge",), None, False, None, None, None, "OUT_DIR"))
EXPECTED["slwm-weights"]["no_save"] = (("--no-save",), False, False, None, None, 0, None)
# taskvec, the task-vector analysis on the analysis home: which models, and whether the cosines too; it saves its run
EXPECTED["taskvec"].update(models=(("--models",), None, False, None, None, "+", None),
                           no_cosines=(("--no-cosines",), False, False, None, None, 0, None),
                           no_save=(("--no-save",), False, False, None, None, 0, None), dry_run=_DRY_RUN)

# Issue 46: the expert level of a mixture of experts; linearity's default is every level the model has (None)
_LEVELS46 = ('model', 'layer', 'attn', 'mlp', 'head', 'expert')
EXPECTED["features"]["level"] = (('--level',), 'layer', False, 'word', _LEVELS46, None, None)
EXPECTED["linearity"]["levels"] = (('--levels',), None, False, None, _LEVELS46, '+', None)

@pytest.mark.parametrize("path", list(EXPECTED))
def test_every_command_keeps_its_arguments(parsers, path):
    got = {a.dest: _row(a) for a in _arguments(parsers[path])}
    assert set(got) == set(EXPECTED[path])
    for dest, row in EXPECTED[path].items():
        assert _same_row(row, got[dest]), f"{path}: {dest}: {got[dest]} (before: {row})"
    assert [a.dest for a in _arguments(parsers[path]) if not a.option_strings] == POSITIONALS.get(path, [])
    func = parsers[path].get_default("func")
    assert (func.__name__ if func else None) == ("run_analysis" if path in GENERATED else FUNCS[path])


def test_shared_arguments_have_one_wording(parsers):
    for path, parser in parsers.items():
        for a in _arguments(parser):
            for option in a.option_strings:
                if option in HELPS:
                    assert a.help in HELPS[option], f"{path} {option}: {a.help!r}"
    for path in CPU_DEFAULT:
        assert parsers[path]._option_string_actions["--device"].help == shared.DEVICE_CPU_HELP
    for path in CUDA_DEFAULT:
        assert parsers[path]._option_string_actions["--device"].help == shared.DEVICE_HELP
    assert "probe pairs" in parsers["search"]._option_string_actions["--max-task"].help   # the probe split


def _minimal_argv(path, parser, *extra):
    """The command line `path` with every required argument given (as "x"), then `extra`."""
    argv = path.split()
    for a in _arguments(parser):
        if not a.option_strings:
            argv.append("x")
        elif a.required:
            argv += [a.option_strings[0], "x"]
    return argv + list(extra)


def test_every_device_goes_through_the_device_check(parsers, capsys):
    with_device = [p for p, parser in parsers.items() if "--device" in parser._option_string_actions]
    assert sorted(with_device) == sorted(CPU_DEFAULT | CUDA_DEFAULT | {"merge"})
    for path in with_device:
        assert parsers[path]._option_string_actions["--device"].type is cli._device, path
        with pytest.raises(SystemExit) as exc:
            cli.build_parser().parse_args(_minimal_argv(path, parsers[path], "--device", "tpu9"))
        assert exc.value.code == 2
        assert "argument --device: Unknown device 'tpu9'" in capsys.readouterr().err, path
        args = cli.build_parser().parse_args(_minimal_argv(path, parsers[path], "--device", "cpu"))
        assert args.device == "cpu"


def test_counts_refuse_zero(parsers, capsys):
    checked = 0
    for path, parser in parsers.items():
        for a in _arguments(parser):
            if getattr(a.type, "__name__", None) == "count":
                with pytest.raises(SystemExit) as exc:
                    cli.build_parser().parse_args(_minimal_argv(path, parser, a.option_strings[0], "0"))
                assert exc.value.code == 2
                assert f"argument {a.option_strings[0]}: must be at least 1" in capsys.readouterr().err
                checked += 1
    assert checked >= 40


OUTPUT_OPTIONS = {
    "attribution": ["--out"], "features": ["--out", "--distances"], "finetune": ["--out"],
    "linearity": ["--out", "--curves"], "slwm-weights": ["--out"], "merge-export": ["--out"],
    "pcb-search": ["--out"], "taskvec": ["--out"], "eval": ["--out"], "search": ["--out", "--save-recipe"],
    "sweep alpha": ["--out"], "sweep pruning": ["--out"], "sweep density": ["--out"], "sweep hma": ["--out"],
    "sweep lines": ["--out"], "sweep rank": ["--out"], "sweep iso": ["--out"], "zoo show": ["--out"],
    "textdiff": ["--out"],
}


def test_every_output_file_has_overwrite_and_is_checked_first(parsers, tmp_path):
    found = {p: [a.option_strings[0] for a in _arguments(parser) if a.dest in shared.OUTPUT_FILES]
             for p, parser in parsers.items()}
    assert {p: o for p, o in found.items() if o} == OUTPUT_OPTIONS
    existing = tmp_path / "exists.csv"
    existing.write_text("a\n1\n")
    for path, options in OUTPUT_OPTIONS.items():
        overwrite = parsers[path]._option_string_actions["--overwrite"]
        assert (overwrite.dest, overwrite.default, overwrite.nargs) == ("overwrite", False, 0)
        for option in options:
            args = cli.build_parser().parse_args(_minimal_argv(path, parsers[path], option, str(existing)))
            with pytest.raises(ForgetlabError, match="exists"):
                cli._check_output_files(args)
            args = cli.build_parser().parse_args(_minimal_argv(path, parsers[path], option, str(existing),
                                                               "--overwrite"))
            cli._check_output_files(args)
            args = cli.build_parser().parse_args(_minimal_argv(path, parsers[path], option, " "))
            with pytest.raises(ForgetlabError, match="is empty"):
                cli._check_output_files(args)


def test_an_existing_output_stops_the_command_before_any_work(tmp_path, capsys):
    existing = tmp_path / "norms.csv"
    existing.write_text("kept\n")
    assert cli.main(["taskvec", str(tmp_path / "no-such-pool.yaml"), "--out", str(existing)]) == 2
    assert "--overwrite" in capsys.readouterr().err and existing.read_text() == "kept\n"


SHARED_FLAGS = ["pool", "--pool", "--device", "--device-map", "--max-memory", "--out", "--curves", "--distances",
                "--overwrite", "--no-save", "--max-general", "--max-task", "--batch-size", "--samples", "--measure",
                "--general-measure", "--lm-eval", "--lm-eval-include", "--limit", "--no-lm-eval", "--executor",
                "--ray-address", "--workers", "--gpus-per-worker"]


def test_shared_arguments_are_declared_once():
    """Only forgetlab/commands/args.py declares the shared arguments (--out, --curves and --distances through
    `add_out`), each once."""
    folder = Path(shared.__file__).parent
    declared = re.compile(r"add_argument\(\s*[\"']([-\w]+)[\"']")
    counts = {}
    for source in sorted(folder.glob("*.py")):
        for flag in declared.findall(source.read_text(encoding="utf-8")):
            counts.setdefault(flag, []).append(source.name)
    for flag in SHARED_FLAGS:
        assert counts.get(flag, ["args.py"]) == ["args.py"], f"{flag} declared in {counts.get(flag)}"
    assert "--device" in counts and '"--out"' in Path(shared.__file__).read_text(encoding="utf-8")


def test_helpers_refuse_what_the_checks_would_miss():
    parser = argparse.ArgumentParser()
    with pytest.raises(ValueError, match="not among the output files"):
        shared.add_out(parser, "a report", flag="--report")
    with pytest.raises(ValueError, match="always required"):
        shared.add_pool(parser, required=False)
    shared.add_pool(parser, flag=True, required=False)
    assert parser.parse_args([]).pool is None
