"""The accountant's numerics, one implementation of each thing, shared by every bound and engine.

`logspace` (log-sum-exp and friends), `binomial` (log pmf, tails, partial expectations and
truncation windows), `roots` (epsilon searches and monotone boundary searches), `krr` (the k-RR
probabilities) and `grid` (PLDs on a loss grid: binning and discretisation). Only `base` and
`accountant.core` are imported from here.
"""
