# The worker processes that run a large request's CPU-heavy steps (offload.py),
# and what each of them does as it starts.
