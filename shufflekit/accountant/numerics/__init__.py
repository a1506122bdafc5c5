"""The accountant's numerics, one implementation of each thing, shared by every bound and engine.

`logspace` (log-sum-exp and friends), `binomial` (log pmf, tails, partial expectations and
truncation windows), `pmf_sum` (sums of binomials by direct or tilted FFT convolution, each
entry with a certified relative error), `roots` (epsilon searches and monotone boundary
searches), `krr` (the k-RR probabilities), `grid` (PLDs on a loss grid: binning and
discretisation) and `maxload` (the expected maximum load of n balls in k bins, for the leakage
of a shuffle); `lru` is the one bounded, thread-safe cache the costly PLDs are kept in. Only
`base` and `accountant.core` are imported from here.
"""
