"""The merge methods, one file per family: each file holds its methods' reference tensor functions, their CPU
kernels and their global statistics, registered with `forgetlab.merge.registry.method` / `fast_kernel`.
Importing this package registers the built-in methods, in the order the app and `forgetlab methods` list them.
`slwm` (submodule-linearity merging) registers when first asked for (`registry.load_plugins`): it pulls in the
evaluation stack. A new method is one new file here, imported below. Formulas: docs/methods.md.
"""
from forgetlab.merge.methods import interpolation  # noqa: F401  linear, wise_ft, hma
from forgetlab.merge.methods import task_arithmetic  # noqa: F401
from forgetlab.merge.methods import ties  # noqa: F401
from forgetlab.merge.methods import dare  # noqa: F401  dare_linear, dare_ties
from forgetlab.merge.methods import breadcrumbs  # noqa: F401
from forgetlab.merge.methods import consensus  # noqa: F401
from forgetlab.merge.methods import pcb  # noqa: F401
from forgetlab.merge.methods import fapm  # noqa: F401
from forgetlab.merge.methods import submodule  # noqa: F401  submodule_alpha
from forgetlab.merge.methods import spherical  # noqa: F401  slerp, nuslerp, multislerp, karcher (mergekit's)
from forgetlab.merge.methods import model_stock  # noqa: F401
from forgetlab.merge.methods import gated  # noqa: F401  nearswap, arcee_fusion
from forgetlab.merge.methods import ram  # noqa: F401  ram, ramplus_tl
from forgetlab.merge.methods import sce  # noqa: F401
from forgetlab.merge.methods import gta  # noqa: F401  della, della_linear, breadcrumbs_ties
from forgetlab.merge.methods import passthrough  # noqa: F401
from forgetlab.merge.methods import lines  # noqa: F401  LiNeS
from forgetlab.merge.methods import tsv  # noqa: F401  TSV-Merge
from forgetlab.merge.methods import isotropic  # noqa: F401  iso_c, iso_cts
from forgetlab.merge.methods import cart  # noqa: F401
from forgetlab.merge.methods import localize_stitch  # noqa: F401
from forgetlab.merge.methods import knots  # noqa: F401
from forgetlab.merge.methods import regmean  # noqa: F401  regmean, regmean_pp (need a pool)
from forgetlab.merge.methods import fisher  # noqa: F401  (needs a pool)
