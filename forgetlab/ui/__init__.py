"""Streamlit adapters for forgetlab's app: the only part of forgetlab that imports streamlit.

One module per job: `pool` (the sidebar's pool, cached), `settings` (device, dtype, evaluation budget, workspace),
`jobs` (long jobs in background threads, once per key), `panel` (the one way a page runs an analysis), `widgets`
(widgets drawn from settings declarations), `errors`, `progress`, `measure`, `memory`, `runs`, `navigation` (the
menu; importing it alone does not import torch), …
"""
