"""The studies: one table or figure of the five papers each (forgetlab.analysis.study), grouped by paper."""
