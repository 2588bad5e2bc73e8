"""What the e2e scripts share (tests/e2e/*.py import from here, never from each other):
harness (worker processes, job files, corpora), cluster (a manager and agents, hosts in
network namespaces, waits), jobs (morph jobs, heterogeneous pipelines, the cache of reference
losses), worker (the worker tests' fixtures), slurm (the Slurm test cluster), hf_models (the
Hugging Face reference) and main (the exit code ctest reads: 77 when a class could only
skip)."""
