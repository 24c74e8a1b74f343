"""The merge methods, one file per family: each file holds its methods' reference tensor functions, their CPU
kernels and their global statistics, registered with `forgetlab.merge.registry.method` / `fast_kernel`, with the
facts about each method (its memory working set, its mergekit name and parameters) in its declaration.
`forgetlab.merge.registry.METHODS` imports these modules itself when a method is first asked for: a new method is
one new file here, imported by nothing. Formulas: docs/methods.md.
"""
